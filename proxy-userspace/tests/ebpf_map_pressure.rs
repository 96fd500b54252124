//! `ebpf_kube_proxy_datapath_map_pressure{map}` on `/metrics` with a real
//! map filled (root only, and only when the binary embeds the eBPF object;
//! otherwise the test says why and passes).
//!
//! The test has its own cgroup, bpffs directory and network namespace,
//! removed by a Drop guard even after a failure.

use aya::maps::{HashMap, Map, MapData};
use ebpf_kube_proxy::datapath::ebpf::{pressure, EbpfDatapath};
use ebpf_kube_proxy::datapath::Datapath;
use proxy_common::{AffinityKey, AffinityValue, MAX_AFFINITY, MAX_CT, MAX_REVNAT};

mod common;
use common::kernel::Env;

fn metrics_text(registry: &prometheus::Registry) -> String {
    prometheus::TextEncoder::new()
        .encode_to_string(&registry.gather())
        .expect("encoding /metrics")
}

fn gauge(text: &str, map: &str) -> Option<f64> {
    let prefix = format!("{}{{map=\"{map}\"}} ", pressure::MAP_PRESSURE);
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.parse().expect("a number"))
}

#[test]
fn a_filled_affinity_map_shows_its_pressure_on_metrics() {
    let Some(mut env) = Env::new("ebpf_map_pressure", "pressure") else {
        return;
    };
    env.add_ns("ns");
    let config = env.config(1 << 16, &["0.0.0.0/32"]);
    let mut dp = EbpfDatapath::open(&config).expect("open");
    let registry = prometheus::Registry::new();
    dp.register_metrics(&registry).expect("metrics");
    let text = metrics_text(&registry);
    assert_eq!(gauge(&text, "EKP_AFFINITY"), Some(0.0), "{text}");
    assert_eq!(gauge(&text, "EKP_CT"), Some(0.0), "{text}");

    // 60,000 affinity entries in the pinned LRU map (65,536).
    let pin = MapData::from_pin(env.bpffs.join("EKP_AFFINITY")).expect("pinned affinity map");
    let mut affinity: HashMap<MapData, AffinityKey, AffinityValue> =
        HashMap::try_from(Map::LruHashMap(pin)).expect("an LRU hash map");
    for i in 0..60_000u32 {
        let key = AffinityKey {
            client_cookie: u64::from(i) + 1,
            service_id: 7,
            _pad: 0,
        };
        affinity
            .insert(key, AffinityValue::default(), 0)
            .expect("insert");
    }
    // What a key-by-key walk finds (an LRU map may evict before it is full).
    let held = affinity.keys().filter(Result::is_ok).count();
    assert!(held > 58_000, "{held}");

    let fills = dp.sample_map_pressure();
    let text = metrics_text(&registry);
    let expected = held as f64 / f64::from(MAX_AFFINITY);
    assert_eq!(gauge(&text, "EKP_AFFINITY"), Some(expected), "{text}");
    assert!(expected > pressure::WARN_RATIO);
    assert_eq!(gauge(&text, "EKP_CT"), Some(0.0), "{text}");
    assert_eq!(gauge(&text, "EKP_EXT_AFFINITY"), Some(0.0), "{text}");
    assert!(gauge(&text, "EKP_REVNAT").is_some(), "{text}");
    let capacity = |map: &str| fills.iter().find(|f| f.map == map).map(|f| f.capacity);
    assert_eq!(capacity("EKP_CT"), Some(MAX_CT));
    assert_eq!(capacity("EKP_REVNAT"), Some(MAX_REVNAT));

    // Two samples above 90 % in a row: warned about once.
    let mut warned = pressure::Warned::default();
    assert!(warned.check(&fills).is_empty());
    assert_eq!(
        warned.check(&dp.sample_map_pressure()),
        vec!["EKP_AFFINITY"]
    );
}
