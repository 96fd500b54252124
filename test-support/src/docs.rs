//! Reading the project's Markdown (`README.md`, `docs/*.md`) the way the
//! docs tests check it: relative links and the headings they point at,
//! fenced blocks, and the commands of `sh` blocks as words.
//!
//! Only what this repository's pages use is understood: `[text](target)`
//! links outside code, ATX headings (`## Title`), and fences of three
//! backticks at the start of a line.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// `README.md` and every `docs/*.md` under `root`, sorted.
pub fn doc_files(root: &Path) -> Vec<PathBuf> {
    let mut files = vec![root.join("README.md")];
    if let Ok(dir) = std::fs::read_dir(root.join("docs")) {
        let mut docs: Vec<PathBuf> = dir
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "md"))
            .collect();
        docs.sort();
        files.extend(docs);
    }
    files
}

/// A fenced block: its info string (`sh`, `python`, …), the line number
/// (1-based) of its first content line, and its content.
pub struct Block {
    pub lang: String,
    pub line: usize,
    pub text: String,
}

/// Every fenced block of `markdown`, in order.
pub fn blocks(markdown: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in markdown.lines().enumerate() {
        let fence = line.trim_start().starts_with("```");
        match (&mut open, fence) {
            (None, true) => {
                open = Some(Block {
                    lang: line.trim_start()[3..].trim().to_owned(),
                    line: i + 2,
                    text: String::new(),
                })
            }
            (Some(_), true) => out.extend(open.take()),
            (Some(b), false) => {
                b.text.push_str(line);
                b.text.push('\n');
            }
            (None, false) => {}
        }
    }
    out
}

/// The lines of `markdown` outside fenced blocks, with their numbers.
fn prose(markdown: &str) -> Vec<(usize, &str)> {
    let mut in_block = false;
    let mut out = Vec::new();
    for (i, line) in markdown.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
        } else if !in_block {
            out.push((i + 1, line));
        }
    }
    out
}

/// Every link target of `markdown` that is not a URL (`http:`, `https:`,
/// `mailto:`), with its line number: `docs/x.md`, `x.md#anchor`, `#anchor`.
pub fn relative_links(markdown: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in prose(markdown) {
        // Inline code spans cannot hold links: blank them first.
        let mut text = String::with_capacity(line.len());
        for (i, part) in line.split('`').enumerate() {
            text.push_str(if i % 2 == 0 { part } else { "" });
        }
        let mut rest = text.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let Some(end) = rest.find(')') else { break };
            let target = rest[..end].trim();
            if !target.contains("://") && !target.starts_with("mailto:") {
                out.push((n, target.to_owned()));
            }
            rest = &rest[end + 1..];
        }
    }
    out
}

/// The anchors GitHub gives the headings of `markdown`: lower case, spaces
/// as `-`, punctuation other than `-` and `_` dropped, a repeated one
/// suffixed `-1`, `-2`, ….
pub fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (_, line) in prose(markdown) {
        let Some(title) = line
            .strip_prefix('#')
            .map(|t| t.trim_start_matches('#'))
            .filter(|t| t.starts_with(' '))
        else {
            continue;
        };
        let slug: String = title
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut candidate = slug.clone();
        let mut k = 0;
        while out.contains(&candidate) {
            k += 1;
            candidate = format!("{slug}-{k}");
        }
        out.insert(candidate);
    }
    out
}

/// Every relative link of `file` (a Markdown page) that leads nowhere:
/// a missing file, or an `#anchor` that is no heading of the Markdown page
/// it names. Each as `file:line: target (why)`.
pub fn broken_links(file: &Path) -> Vec<String> {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) => return vec![format!("{}: {e}", file.display())],
    };
    let dir = file.parent().unwrap_or(Path::new("."));
    let mut out = Vec::new();
    for (n, target) in relative_links(&text) {
        let (path, anchor) = match target.split_once('#') {
            Some((p, a)) => (p, Some(a)),
            None => (target.as_str(), None),
        };
        let resolved = if path.is_empty() {
            file.to_path_buf()
        } else {
            dir.join(path)
        };
        let why = if !resolved.exists() {
            Some(format!("no file {}", resolved.display()))
        } else {
            anchor.and_then(|a| {
                let page = std::fs::read_to_string(&resolved).unwrap_or_default();
                (!anchors(&page).contains(a))
                    .then(|| format!("no heading #{a} in {}", resolved.display()))
            })
        };
        if let Some(why) = why {
            out.push(format!("{}:{n}: {target} ({why})", file.display()));
        }
    }
    out
}

/// The commands of the `sh` blocks of `markdown`, as words, with the line
/// each starts on: comments dropped, `\` continuations joined, quotes
/// removed, and a pipeline or list (`|`, `||`, `&&`, `;`) split into its
/// commands.
pub fn sh_commands(markdown: &str) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    for block in blocks(markdown).into_iter().filter(|b| b.lang == "sh") {
        let mut pending = String::new();
        let mut start = block.line;
        for (i, line) in block.text.lines().enumerate() {
            if pending.is_empty() {
                start = block.line + i;
            }
            match line.strip_suffix('\\') {
                Some(head) => {
                    pending.push_str(head);
                    pending.push(' ');
                }
                None => {
                    pending.push_str(line);
                    for cmd in split_commands(&pending) {
                        out.push((start, cmd));
                    }
                    pending.clear();
                }
            }
        }
    }
    out
}

/// One shell line as commands of words (see [`sh_commands`]).
fn split_commands(line: &str) -> Vec<Vec<String>> {
    let mut commands = Vec::new();
    let mut words: Vec<String> = Vec::new();
    let mut word: Option<String> = None;
    let mut quote: Option<char> = None;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.get_or_insert_default().push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                word.get_or_insert_default();
            }
            (None, '#') if word.is_none() => break,
            (None, ' ' | '\t') => words.extend(word.take()),
            (None, '|' | ';' | '&') => {
                words.extend(word.take());
                if chars.peek() == Some(&c) {
                    chars.next();
                }
                if !words.is_empty() {
                    commands.push(std::mem::take(&mut words));
                }
            }
            (None, c) => word.get_or_insert_default().push(c),
        }
    }
    words.extend(word);
    if !words.is_empty() {
        commands.push(words);
    }
    commands
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(ws: &[&str]) -> Vec<String> {
        ws.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn sh_blocks_become_commands_of_words() {
        let md = "text `cargo xtask nope`\n\n```sh\ncargo xtask bench --quick   # a comment\n\
                  E2E_TEST=/x deploy/kind/conformance.sh\n\
                  kubectl patch ds --type=json -p='[{\"op\": \"add\"}]' \\\n  --dry-run\n\
                  a --x | b; c && d\n```\n\n```python\nimport sys\n```\n";
        assert_eq!(
            sh_commands(md),
            vec![
                (4, words(&["cargo", "xtask", "bench", "--quick"])),
                (5, words(&["E2E_TEST=/x", "deploy/kind/conformance.sh"])),
                (
                    6,
                    words(&[
                        "kubectl",
                        "patch",
                        "ds",
                        "--type=json",
                        "-p=[{\"op\": \"add\"}]",
                        "--dry-run"
                    ])
                ),
                (8, words(&["a", "--x"])),
                (8, words(&["b"])),
                (8, words(&["c"])),
                (8, words(&["d"])),
            ]
        );
    }

    #[test]
    fn links_outside_code_and_urls_only() {
        let md = "See [a](docs/a.md#x-y) and [b](https://example.com), `[c](no.md)`\n\
                  ```sh\necho [d](no2.md)\n```\n[e](#here)\n";
        assert_eq!(
            relative_links(md),
            vec![(1, "docs/a.md#x-y".to_owned()), (5, "#here".to_owned())]
        );
    }

    #[test]
    fn anchors_as_github_makes_them() {
        let md = "# Top\n## What differs from kube-proxy\n### Delta `Watch`\n## Top\n\
                  ```sh\n# not a heading\n```\n#nospace\n";
        let got: Vec<_> = anchors(md).into_iter().collect();
        assert_eq!(
            got,
            vec![
                "delta-watch",
                "top",
                "top-1",
                "what-differs-from-kube-proxy"
            ]
        );
    }

    #[test]
    fn a_missing_file_or_heading_is_a_broken_link() {
        let dir = std::env::temp_dir().join(format!("ekp-docs-links-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("docs")).unwrap();
        std::fs::write(dir.join("docs/a.md"), "# A\n## Real heading\n").unwrap();
        std::fs::write(
            dir.join("README.md"),
            "[ok](docs/a.md) [ok](docs/a.md#real-heading) [gone](docs/b.md)\n\
             [bad](docs/a.md#no-such-heading) [self](#a-title)\n",
        )
        .unwrap();
        let broken = broken_links(&dir.join("README.md"));
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(broken.len(), 3, "{broken:#?}");
        assert!(broken[0].contains("docs/b.md (no file"), "{broken:#?}");
        assert!(
            broken[1].contains("docs/a.md#no-such-heading (no heading #no-such-heading"),
            "{broken:#?}"
        );
        assert!(broken[2].contains("#a-title (no heading"), "{broken:#?}");
    }
}
