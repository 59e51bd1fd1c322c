//! The cluster's pure parts (docs/cluster.md): what a node publishes about itself in etcd
//! ([`record`]), the consistent-hash ring with bounded loads that picks a node for a path
//! ([`ring`]), the redirect choice built on it ([`choose_redirect`]), and the HAProxy
//! configuration rendered from the membership ([`haproxy`]).
//!
//! No I/O and no clock here: the server's membership thread talks to etcd and hands what it
//! read to these functions; `penstock cluster haproxy-config` writes what [`haproxy::render`]
//! returns.

pub mod haproxy;
pub mod record;
pub mod ring;

pub use record::{NodeName, NodeRecord, RecordError, check_fill_key};
pub use ring::Ring;

/// The node a stream open refused here is sent to: among the other nodes that advertise
/// the needed address (`want(record)`) and have at least `need_bytes_per_s` of rt bandwidth
/// left, the owner of `key` (the request's path) on the ring of those nodes' names — the
/// same ring on every node, so that redirects for one path agree cluster-wide. `None`: no
/// other node can take it (the refusal stands).
pub fn choose_redirect<'a>(
    key: &str,
    self_name: &str,
    nodes: &'a [NodeRecord],
    need_bytes_per_s: u64,
    want: impl Fn(&NodeRecord) -> bool,
) -> Option<&'a NodeRecord> {
    let candidates: Vec<&NodeRecord> = nodes
        .iter()
        .filter(|n| n.name.as_str() != self_name)
        .filter(|n| n.rt_bytes_per_s_left >= need_bytes_per_s.max(1))
        .filter(|n| want(n))
        .collect();
    let names: Vec<&str> = candidates.iter().map(|n| n.name.as_str()).collect();
    let ring = Ring::new(&names, ring::POINTS_PER_NODE);
    ring.owner(key).map(|i| candidates[i])
}

/// The node that fills `key` (a path) from the origin for the whole cluster: the owner of
/// `key` on the ring of the names of the nodes that have an origin cache (`cache_bytes`
/// published), this one included — the same answer on every node with the same listing.
/// `None` when that is this node (or no node has a cache): fetch from the origin itself.
/// Every other node fetches the path's blocks from the owner, so that the origin sends each
/// block once however HAProxy spreads the path's readers (docs/origin.md, "In a cluster").
pub fn fill_owner<'a>(
    key: &str,
    self_name: &str,
    nodes: &'a [NodeRecord],
) -> Option<&'a NodeRecord> {
    let caching: Vec<&NodeRecord> = nodes.iter().filter(|n| n.cache_bytes.is_some()).collect();
    let names: Vec<&str> = caching.iter().map(|n| n.name.as_str()).collect();
    let ring = Ring::new(&names, ring::POINTS_PER_NODE);
    let owner = caching[ring.owner(key)?];
    (owner.name.as_str() != self_name).then_some(owner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn node(name: &str, left: u64) -> NodeRecord {
        NodeRecord {
            name: NodeName::new(name).unwrap(),
            http: format!("{name}.example:8080"),
            rtsp: Some(format!("{name}.example:8554")),
            control: None,
            rt_bytes_per_s: 1000,
            rt_bytes_per_s_left: left,
            streams: 0,
            streams_max: 10,
            cache_bytes: None,
            fill_key: None,
            https: None,
        }
    }

    #[test]
    fn a_redirect_never_names_the_refusing_node_nor_a_full_one() {
        let nodes = vec![node("a", 1000), node("b", 0), node("c", 500)];
        for k in 0..200 {
            let key = format!("/media/{k}.ts");
            let n = choose_redirect(&key, "a", &nodes, 100, |_| true).expect("c has room");
            assert_eq!(n.name.as_str(), "c");
        }
        // Nobody else has 600 left: the refusal stands.
        assert!(choose_redirect("/x", "a", &nodes, 600, |_| true).is_none());
        // A node without the wanted address is not a candidate.
        assert!(choose_redirect("/x", "a", &nodes, 1, |n| n.control.is_some()).is_none());
    }

    proptest! {
        /// Every node computes the same answer from the same membership, whatever order
        /// etcd listed it in.
        #[test]
        fn the_redirect_choice_does_not_depend_on_the_listing_order(
            lefts in proptest::collection::vec(0u64..2000, 2..8),
            key in "/[a-z]{1,12}",
            rot in 0usize..8,
        ) {
            let mut nodes: Vec<NodeRecord> = lefts
                .iter()
                .enumerate()
                .map(|(i, &l)| node(&format!("n{i}"), l))
                .collect();
            let a = choose_redirect(&key, "n0", &nodes, 100, |_| true).map(|n| n.name.clone());
            let r = rot % nodes.len();
            nodes.rotate_left(r);
            let b = choose_redirect(&key, "n0", &nodes, 100, |_| true).map(|n| n.name.clone());
            prop_assert_eq!(&a, &b);
            if let Some(n) = a {
                prop_assert!(n.as_str() != "n0");
                let rec = nodes.iter().find(|x| x.name == n).unwrap();
                prop_assert!(rec.rt_bytes_per_s_left >= 100);
            } else {
                prop_assert!(nodes.iter().all(|x| x.name.as_str() == "n0" || x.rt_bytes_per_s_left < 100));
            }
        }
    }

    #[test]
    fn one_node_fills_each_path_and_every_node_agrees_which() {
        let mut nodes: Vec<NodeRecord> = ["a", "b", "c", "d"].iter().map(|n| node(n, 0)).collect();
        for n in &mut nodes[..3] {
            n.cache_bytes = Some(0);
        }
        for k in 0..200 {
            let key = format!("/v/f{k}.bin");
            let answers: Vec<Option<&str>> = ["a", "b", "c", "d"]
                .iter()
                .map(|me| fill_owner(&key, me, &nodes).map(|n| n.name.as_str()))
                .collect();
            // Exactly one of the caching nodes answers "myself" (None); all others name it.
            let selves: Vec<usize> = (0..3).filter(|&i| answers[i].is_none()).collect();
            assert_eq!(selves.len(), 1, "{key}: {answers:?}");
            let owner = ["a", "b", "c"][selves[0]];
            for (i, a) in answers.iter().enumerate() {
                if i != selves[0] {
                    assert_eq!(*a, Some(owner), "{key}: {answers:?}");
                }
            }
        }
        // No node with a cache: everyone asks the origin.
        for n in &mut nodes {
            n.cache_bytes = None;
        }
        assert!(fill_owner("/x", "a", &nodes).is_none());
    }
}
