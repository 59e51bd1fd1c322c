//! The block cache's bookkeeping: which blocks are cached (and how recently used), which are
//! being fetched, and what to evict to stay under the byte limit. The server holds one
//! [`BlockTable`] under a lock and does the I/O it decides: a [`Want::Fetch`] fetches, a
//! [`Want::Wait`] waits for that fetch (one origin request per block however many readers
//! want it), [`BlockTable::stored`] names the blocks to delete.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

/// What a reader of a block does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// Cached: read it (now the most recently used).
    Hit,
    /// Absent: this reader fetches it and then calls [`BlockTable::stored`] or
    /// [`BlockTable::failed`].
    Fetch,
    /// Another reader is fetching it: wait, then ask again.
    Wait,
}

#[derive(Debug, Clone, Copy)]
enum Entry {
    Fetching,
    Cached { bytes: u64, stamp: u64 },
}

/// The result of [`BlockTable::stored`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored<K> {
    /// False when the block alone is over the limit: serve it, then delete it.
    pub kept: bool,
    /// Least recently used blocks pushed out, to delete.
    pub evicted: Vec<K>,
}

/// Blocks by key, with an LRU byte limit over the cached ones.
#[derive(Debug, Clone)]
pub struct BlockTable<K> {
    bytes_max: u64,
    bytes_cached: u64,
    entries: HashMap<K, Entry>,
    /// Use stamp → key, oldest first.
    lru: BTreeMap<u64, K>,
    next_stamp: u64,
}

impl<K: Clone + Eq + Hash> BlockTable<K> {
    pub fn new(bytes_max: u64) -> BlockTable<K> {
        BlockTable {
            bytes_max,
            bytes_cached: 0,
            entries: HashMap::new(),
            lru: BTreeMap::new(),
            next_stamp: 0,
        }
    }

    pub fn bytes_max(&self) -> u64 {
        self.bytes_max
    }

    pub fn bytes_cached(&self) -> u64 {
        self.bytes_cached
    }

    /// Cached blocks.
    pub fn cached(&self) -> usize {
        self.lru.len()
    }

    pub fn is_cached(&self, key: &K) -> bool {
        matches!(self.entries.get(key), Some(Entry::Cached { .. }))
    }

    fn stamp(&mut self) -> u64 {
        self.next_stamp += 1;
        self.next_stamp
    }

    /// A reader wants `key`.
    pub fn want(&mut self, key: &K) -> Want {
        match self.entries.get(key).copied() {
            Some(Entry::Cached { bytes, stamp }) => {
                let new = self.stamp();
                self.lru.remove(&stamp);
                self.lru.insert(new, key.clone());
                self.entries
                    .insert(key.clone(), Entry::Cached { bytes, stamp: new });
                Want::Hit
            }
            Some(Entry::Fetching) => Want::Wait,
            None => {
                self.entries.insert(key.clone(), Entry::Fetching);
                Want::Fetch
            }
        }
    }

    /// Read-ahead: takes the fetch of `key` only if nobody has it (cached or fetching); no
    /// use is recorded.
    pub fn claim(&mut self, key: &K) -> bool {
        if self.entries.contains_key(key) {
            return false;
        }
        self.entries.insert(key.clone(), Entry::Fetching);
        true
    }

    /// The fetch of `key` (taken with [`Want::Fetch`] or [`BlockTable::claim`]) stored
    /// `bytes`: cached as the most recently used, least recently used blocks evicted to stay
    /// under the limit.
    ///
    /// # Panics
    /// If `key` was not being fetched (a broken caller).
    pub fn stored(&mut self, key: &K, bytes: u64) -> Stored<K> {
        assert!(
            matches!(self.entries.get(key), Some(Entry::Fetching)),
            "stored without a fetch"
        );
        if bytes > self.bytes_max {
            self.entries.remove(key);
            return Stored {
                kept: false,
                evicted: Vec::new(),
            };
        }
        let mut evicted = Vec::new();
        while self.bytes_cached + bytes > self.bytes_max {
            let (_, old) = self
                .lru
                .pop_first()
                .expect("bytes cached > 0 means a cached block");
            if let Some(Entry::Cached { bytes: b, .. }) = self.entries.remove(&old) {
                self.bytes_cached -= b;
            }
            evicted.push(old);
        }
        let stamp = self.stamp();
        self.lru.insert(stamp, key.clone());
        self.entries
            .insert(key.clone(), Entry::Cached { bytes, stamp });
        self.bytes_cached += bytes;
        debug_assert!(self.bytes_cached <= self.bytes_max);
        Stored {
            kept: true,
            evicted,
        }
    }

    /// The fetch of `key` failed: it is absent again (the next reader fetches).
    pub fn failed(&mut self, key: &K) {
        if matches!(self.entries.get(key), Some(Entry::Fetching)) {
            self.entries.remove(key);
        }
    }

    /// Forgets a cached block (its file went missing, or its object changed); a fetch in
    /// flight is left alone. True when it was cached.
    pub fn remove(&mut self, key: &K) -> bool {
        match self.entries.get(key).copied() {
            Some(Entry::Cached { bytes, stamp }) => {
                self.entries.remove(key);
                self.lru.remove(&stamp);
                self.bytes_cached -= bytes;
                true
            }
            _ => false,
        }
    }

    /// Forgets every cached block for which `pred` holds (an object that changed); returns
    /// them, to delete.
    pub fn remove_where(&mut self, mut pred: impl FnMut(&K) -> bool) -> Vec<K> {
        let keys: Vec<K> = self.lru.values().filter(|k| pred(k)).cloned().collect();
        for k in &keys {
            self.remove(k);
        }
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn one_fetch_per_block_and_lru_order() {
        let mut t = BlockTable::new(10);
        assert_eq!(t.want(&1), Want::Fetch);
        assert_eq!(t.want(&1), Want::Wait);
        assert!(!t.claim(&1));
        assert_eq!(t.stored(&1, 4).evicted, Vec::<i32>::new());
        assert_eq!(t.want(&1), Want::Hit);
        assert!(t.claim(&2));
        t.stored(&2, 4);
        // 1 used after 2 was stored? No: 1 was used before; use it now.
        assert_eq!(t.want(&1), Want::Hit);
        assert_eq!(t.want(&3), Want::Fetch);
        assert_eq!(t.stored(&3, 4).evicted, vec![2]);
        assert_eq!(t.bytes_cached(), 8);
        // Bigger than the whole cache: served, not kept.
        assert_eq!(t.want(&4), Want::Fetch);
        assert!(!t.stored(&4, 11).kept);
        assert_eq!(t.want(&4), Want::Fetch);
        t.failed(&4);
        assert_eq!(t.want(&4), Want::Fetch);
        assert_eq!(t.remove_where(|k| *k == 1 || *k == 3).len(), 2);
        assert_eq!(t.bytes_cached(), 0);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Want(u8),
        Claim(u8),
        Store(u8, u64),
        Fail(u8),
        Remove(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..12).prop_map(Op::Want),
            (0u8..12).prop_map(Op::Claim),
            (0u8..12, 1u64..40).prop_map(|(k, b)| Op::Store(k, b)),
            (0u8..12).prop_map(Op::Fail),
            (0u8..12).prop_map(Op::Remove),
        ]
    }

    proptest! {
        /// Against a model: never two fetches of one block at once, the byte count is the
        /// sum of cached blocks and stays under the limit, and eviction takes the least
        /// recently used block first.
        #[test]
        fn table_matches_a_model(max in 1u64..120, ops in proptest::collection::vec(op(), 0..200)) {
            let mut t = BlockTable::new(max);
            // key → None (fetching) | Some(bytes); `order`: cached keys, least recent first.
            let mut model: HashMap<u8, Option<u64>> = HashMap::new();
            let mut order: Vec<u8> = Vec::new();
            for o in ops {
                match o {
                    Op::Want(k) => {
                        let w = t.want(&k);
                        match model.get(&k) {
                            Some(Some(_)) => {
                                prop_assert_eq!(w, Want::Hit);
                                order.retain(|x| *x != k);
                                order.push(k);
                            }
                            Some(None) => prop_assert_eq!(w, Want::Wait),
                            None => {
                                prop_assert_eq!(w, Want::Fetch);
                                model.insert(k, None);
                            }
                        }
                    }
                    Op::Claim(k) => {
                        let c = t.claim(&k);
                        prop_assert_eq!(c, !model.contains_key(&k));
                        if c { model.insert(k, None); }
                    }
                    Op::Store(k, b) => {
                        if model.get(&k) != Some(&None) { continue; }
                        let s = t.stored(&k, b);
                        if b > max {
                            prop_assert!(!s.kept);
                            model.remove(&k);
                            continue;
                        }
                        let mut used: u64 = model.values().flatten().sum();
                        let mut expect = Vec::new();
                        while used + b > max {
                            let old = order.remove(0);
                            used -= model.remove(&old).flatten().unwrap();
                            expect.push(old);
                        }
                        prop_assert_eq!(s.evicted, expect);
                        model.insert(k, Some(b));
                        order.push(k);
                    }
                    Op::Fail(k) => {
                        t.failed(&k);
                        if model.get(&k) == Some(&None) { model.remove(&k); }
                    }
                    Op::Remove(k) => {
                        let r = t.remove(&k);
                        prop_assert_eq!(r, matches!(model.get(&k), Some(Some(_))));
                        if r { model.remove(&k); order.retain(|x| *x != k); }
                    }
                }
                let used: u64 = model.values().flatten().sum();
                prop_assert_eq!(t.bytes_cached(), used);
                prop_assert!(used <= max);
                prop_assert_eq!(t.cached(), order.len());
            }
        }
    }
}
