//! A consistent-hash ring with bounded loads (Mirrokni, Thorup, Zadimoghaddam, "Consistent
//! Hashing with Bounded Loads", 2016 — what HAProxy's `hash-balance-factor` implements).
//!
//! Each node is placed at [`POINTS_PER_NODE`] points (hashes of `name#i`); a key belongs to
//! the first point at or after its hash, going round. Adding or removing a node moves only
//! the keys of the points it gains or loses. [`Ring::choose_bounded`] skips, going round,
//! every node whose load would exceed `factor_percent`% of the mean: with factor ≥ 100 some
//! node always qualifies, and none is ever given more than the bound.
//!
//! The hash is FNV-1a over the bytes followed by SplitMix64's finalizer (FNV alone spreads
//! short, similar names badly): stable across versions and machines, which the ring needs —
//! every node must compute the same owner for a path.

/// Points per node on the ring: enough for the keys of 3 nodes to split within a few
/// percent of a third each, few enough to build a ring per decision.
pub const POINTS_PER_NODE: usize = 160;

/// The ring's hash of `bytes`.
pub fn hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// Nodes (by index into the names it was built from) placed on a hash ring.
#[derive(Debug, Clone)]
pub struct Ring {
    /// (point, node index), sorted by point then index.
    points: Vec<(u64, usize)>,
    nodes: usize,
}

impl Ring {
    /// Places each of `names` at `points_per_node` points (at least 1). Equal names are
    /// distinct nodes at the same points (the lower index wins a tie).
    pub fn new(names: &[&str], points_per_node: usize) -> Ring {
        let per = points_per_node.max(1);
        let mut points = Vec::with_capacity(names.len() * per);
        for (i, name) in names.iter().enumerate() {
            for p in 0..per {
                points.push((hash(format!("{name}#{p}").as_bytes()), i));
            }
        }
        points.sort_unstable();
        Ring {
            points,
            nodes: names.len(),
        }
    }

    /// Nodes on the ring.
    pub fn len(&self) -> usize {
        self.nodes
    }

    pub fn is_empty(&self) -> bool {
        self.nodes == 0
    }

    /// The index of the first point at or after `key`'s hash, going round.
    fn start(&self, key: &str) -> usize {
        let h = hash(key.as_bytes());
        let i = self.points.partition_point(|&(p, _)| p < h);
        if i == self.points.len() { 0 } else { i }
    }

    /// The node `key` belongs to (`None` on an empty ring).
    pub fn owner(&self, key: &str) -> Option<usize> {
        if self.points.is_empty() {
            return None;
        }
        Some(self.points[self.start(key)].1)
    }

    /// The bound on a node's load once one more is placed: `ceil(factor% × (total + 1) / n)`.
    pub fn load_bound(&self, loads: &[u64], factor_percent: u32) -> u64 {
        let n = self.nodes.max(1) as u128;
        let total: u128 = loads.iter().map(|&l| u128::from(l)).sum::<u128>() + 1;
        let f = u128::from(factor_percent.max(100));
        // ceil(f × total / (100 n)); at least 1 so that an empty cluster takes a first load.
        let b = (f * total).div_ceil(100 * n).max(1);
        u64::try_from(b).unwrap_or(u64::MAX)
    }

    /// The node `key` goes to when each node `i` carries `loads[i]` (one entry per node):
    /// going round from the key's point, the first node whose load stays within
    /// [`Ring::load_bound`] after taking it. A `factor_percent` below 100 counts as 100.
    pub fn choose_bounded(&self, key: &str, loads: &[u64], factor_percent: u32) -> Option<usize> {
        assert_eq!(loads.len(), self.nodes, "one load per node");
        if self.points.is_empty() {
            return None;
        }
        let bound = self.load_bound(loads, factor_percent);
        let start = self.start(key);
        let len = self.points.len();
        (0..len)
            .map(|k| self.points[(start + k) % len].1)
            .find(|&i| loads[i].saturating_add(1) <= bound)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("node-{i}")).collect()
    }

    #[test]
    fn keys_spread_over_three_nodes_within_a_few_percent() {
        let n = names(3);
        let refs: Vec<&str> = n.iter().map(String::as_str).collect();
        let ring = Ring::new(&refs, POINTS_PER_NODE);
        let mut count = [0u32; 3];
        for k in 0..30_000 {
            count[ring.owner(&format!("/media/file-{k}.ts")).unwrap()] += 1;
        }
        for c in count {
            // 10,000 each when even; the ring's points make it uneven by a few percent.
            assert!((8_500..11_500).contains(&c), "{count:?}");
        }
    }

    proptest! {
        /// Removing a node moves only the keys that node owned.
        #[test]
        fn removing_a_node_moves_only_its_keys(n in 2usize..8, gone in 0usize..8, keys in proptest::collection::vec("[a-z/]{1,16}", 1..64)) {
            let gone = gone % n;
            let all = names(n);
            let refs: Vec<&str> = all.iter().map(String::as_str).collect();
            let before = Ring::new(&refs, 40);
            let rest: Vec<&str> = refs.iter().enumerate().filter(|&(i, _)| i != gone).map(|(_, s)| *s).collect();
            let after = Ring::new(&rest, 40);
            for k in &keys {
                let b = refs[before.owner(k).unwrap()];
                let a = rest[after.owner(k).unwrap()];
                if b != refs[gone] {
                    prop_assert_eq!(a, b);
                }
            }
        }

        /// No node is ever given a load above the bound, and some node is always chosen.
        #[test]
        fn bounded_choice_never_exceeds_the_bound(n in 1usize..8, factor in 100u32..300, keys in proptest::collection::vec("[a-z0-9]{1,12}", 1..300)) {
            let all = names(n);
            let refs: Vec<&str> = all.iter().map(String::as_str).collect();
            let ring = Ring::new(&refs, 20);
            let mut loads = vec![0u64; n];
            for k in &keys {
                let bound = ring.load_bound(&loads, factor);
                let i = ring.choose_bounded(k, &loads, factor);
                prop_assert!(i.is_some());
                let i = i.unwrap();
                loads[i] += 1;
                prop_assert!(loads[i] <= bound, "load {} over bound {}", loads[i], bound);
            }
        }

        /// Without load, the bounded choice is the plain owner.
        #[test]
        fn an_idle_ring_chooses_the_owner(n in 1usize..8, key in "[a-z0-9/]{1,20}") {
            let all = names(n);
            let refs: Vec<&str> = all.iter().map(String::as_str).collect();
            let ring = Ring::new(&refs, 20);
            prop_assert_eq!(ring.choose_bounded(&key, &vec![0; n], 150), ring.owner(&key));
        }
    }
}
