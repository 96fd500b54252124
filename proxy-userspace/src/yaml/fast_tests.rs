use serde_json::Value;

use super::*;

/// Every document through the fast path, `None` when it leaves one to the
/// general parser.
fn fast(text: &str) -> Option<Vec<Value>> {
    documents(text)?
        .into_iter()
        .map(|d| from_document::<Value>(d).ok())
        .collect()
}

fn general(text: &str) -> Vec<Value> {
    let mut reader = text.as_bytes();
    serde_saphyr::read_with_options::<_, Value>(&mut reader, super::super::options())
        .filter(|d| !matches!(d, Ok(Value::Null)))
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("{text:?}: {e}"))
}

#[test]
fn reads_what_the_general_parser_reads() {
    for text in [
        // kubectl's style: sorted keys, sequences at their key's column.
        "---\napiVersion: v1\nkind: Service\nmetadata:\n  creationTimestamp: \"2026-11-01T00:00:00Z\"\n  labels:\n    app: svc-0\n  name: svc-0\n  namespace: bench\n  uid: 6e789e6a-a1b9-45f4-86c4-5d188009454f\nspec:\n  clusterIP: 10.96.1.0\n  clusterIPs: [10.96.1.0]\n  ports:\n  - name: http\n    port: 80\n    protocol: TCP\n    targetPort: 8080\n  selector:\n    app: svc-0\nstatus:\n  loadBalancer: {}\n",
        "addressType: IPv4\nendpoints:\n- addresses:\n  - 10.128.0.0\n  conditions:\n    ready: true\n  nodeName: node-2\n- addresses: [10.128.0.1]\n  targetRef:\n    kind: Pod\nkind: EndpointSlice\n",
        // Operators' style: flow mappings.
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: a, labels: {kubernetes.io/service-name: web}}\nspec:\n  ports:\n  - {name: \"http\", protocol: TCP, port: 80, targetPort: 8080}\n",
        "endpoints:\n- {addresses: [\"10.0.0.1\"], nodeName: n1, conditions: {ready: true}, targetRef: {kind: Pod, namespace: a, name: p}}\n",
        // Comments and blank lines anywhere.
        "# head\na: 1 # one\n\n   # indented\nb:\n  # before\n  - x # item\n  - w\n#end",
        // Indented sequences, values on the next line, empty items.
        "a:\n  - 1\n  - 2\nb:\n    c\nd:\n-\n  e: 1\n-\n- f\n",
        // Nulls and empties.
        "a:\nb: ~\nc: null\nd: \"\"\ne: ''\nf: []\ng: {}\nh: NULL\ni:\n",
        // Quoted text and keys.
        "a: \"x\\\"y\\u00e9\\n\\/\"\nb: 'it''s ''q'''\n\"c d\": 1\n'e': 2\nf: \"# not a comment\"\ng: 'a: b'\n",
        // Plain scalars: numbers, booleans, text that looks a little like numbers.
        "a: 10.96.0.1\nb: -5\nc: 0\nd: 18446744073709551615\ne: True\nf: 6e789e6a-a1b9-45f4-86c4-5d188009454f\ng: 2026-11-01\nh: /x/y\ni: a b  c\nj: a#b\nk: fd00::1\nl: \"2001:db8::1\"\nm: FALSE\nn: -9223372036854775808\no: 1.2.3\np: a:b\nq: x, y [z]\nr: yes\ns: n\nt: Off\nu: 5b6cc3d0-1b0c-45de\nv: 1bc4ad12\nw: 7e5x\nx: 0b02996a-680e\nz: 0x1g\n",
        // Nested flow collections.
        "a: [[1, 2], [], {b: [c, {d: e}]}]\nf: {g: {}, h: [i]}\n",
        // Windows line ends.
        "a: 1\r\nb:\r\n- c\r\n- {d: e}\r\n",
        // Several documents, empty ones and comment-only ones left out.
        "---\na: 1\n---\n---\n# nothing\n---\nb: [2]\n",
    ] {
        let f = fast(text).unwrap_or_else(|| panic!("not read by the fast path: {text:?}"));
        assert_eq!(f, general(text), "{text:?}");
    }
}

#[test]
fn everything_else_is_left_to_the_general_parser() {
    let deep = format!(
        "a: {}{}\n",
        "[".repeat(MAX_DEPTH + 2),
        "]".repeat(MAX_DEPTH + 2)
    );
    for text in [
        // Duplicate keys, at the top and deeper, block and flow.
        "a: 1\nb: 2\na: 3\n",
        "a:\n  b: 1\n  b: 2\n",
        "a: {b: 1, b: 2}\n",
        "a: 1\n\"a\": 2\n",
        // Anchors, aliases, tags, block scalars.
        "a: &x 1\nb: *x\n",
        "a: !!str 1\n",
        "a: |\n  x\n",
        "a: >-\n  x\n",
        // Scalars over more than one line.
        "a: b\n  c\n",
        "a: \"b\n  c\"\n",
        "a: [1,\n  2]\n",
        // Tabs, directives, markers with more on the line, a byte-order mark.
        "a:\n\t- 1\n",
        "%YAML 1.2\n---\na: 1\n",
        "--- a: 1\n",
        "a: 1\n...\n",
        "\u{feff}a: 1\n",
        // Plain scalars some reader takes for something else.
        "a: 1.5\n",
        "a: 0x1f\n",
        "a: 0b101\n",
        "a: 0O17\n",
        "a: 1e-5\n",
        "a: 1_000\n",
        "a: .inf\n",
        "a: 0127\n",
        "a: 1e3\n",
        "a: -x\n",
        "a: 18446744073709551616\n",
        "a: nan\n",
        // Shapes this path does not read, or that are wrong.
        "- a\n- b\n",
        "  a: 1\n",
        "a:\n  b: 1\n c: 2\n",
        "a:\n  b: 1\n    c: 2\n",
        "a: b: c\n",
        "? a\n: b\n",
        "a: [1, 2,]\n",
        "a:\n- - 1\n",
        "a: [b: c]\n",
        "a: \"x\"y\n",
        "a: 1\n- b\n",
        &deep,
    ] {
        assert_eq!(fast(text), None, "{text:?}");
    }
}

#[test]
fn strings_are_borrowed_unless_unescaped() {
    let doc = "a: plain\nb: \"quoted\"\nc: \"esc\\n\"\nd: 'it''s'\n";
    let map: std::collections::BTreeMap<&str, Cow<'_, str>> = {
        #[derive(serde::Deserialize)]
        struct Texts<'a>(
            #[serde(borrow)] std::collections::BTreeMap<&'a str, crate::sources::wire::Text<'a>>,
        );
        let Texts(m) = from_document(doc).unwrap();
        m.into_iter().map(|(k, v)| (k, v.0)).collect()
    };
    assert!(matches!(map["a"], Cow::Borrowed("plain")));
    assert!(matches!(map["b"], Cow::Borrowed("quoted")));
    assert_eq!(map["c"], "esc\n");
    assert_eq!(map["d"], "it's");
}

#[test]
fn top_level_strings_are_found_anywhere_in_the_document() {
    let doc = "addressType: IPv4\nendpoints:\n- kind: x\nkind: EndpointSlice # c\napiVersion: \"discovery.k8s.io/v1\"\n";
    assert_eq!(
        top_level_string(doc, "kind").as_deref(),
        Some("EndpointSlice")
    );
    assert_eq!(
        top_level_string(doc, "apiVersion").as_deref(),
        Some("discovery.k8s.io/v1")
    );
    assert_eq!(top_level_string("kind: 1\n", "kind"), None);
    assert_eq!(top_level_string("kind: a\nkind: b\n", "kind"), None);
    assert_eq!(top_level_string("kinds: a\n", "kind"), None);
    assert_eq!(top_level_string("'kind': a\n\"kind\" : b\n", "kind"), None);
    assert_eq!(
        top_level_string("\"kind\": 'a'\n", "kind").as_deref(),
        Some("a")
    );
}
