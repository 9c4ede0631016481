//! The one policy of every in-memory cache of tessel's (parsed kernels, plans, compiled launches,
//! lowered text, specializations, device functions): at most a fixed number of entries, and a
//! full cache starts afresh. A process that launches thousands of different kernels keeps memory
//! bounded; one that repeats a few keeps them all; starting afresh costs some plans and
//! compilations again, never a wrong answer. (wgpu's pipelines and bind groups, which the device
//! holds, drop their oldest entry instead: `tessel_wgpu::runtime`.)

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Mutex, PoisonError};

/// Values by key, at most `cap` of them, shared between threads. A panic while the lock was held
/// leaves the map as it was before or after one insert, so a poisoned lock is used as it is.
#[derive(Debug)]
pub struct Kept<K, V> {
    cap: usize,
    map: Mutex<Option<HashMap<K, V>>>,
}

impl<K: Eq + Hash, V: Clone> Kept<K, V> {
    /// An empty cache of at most `cap` entries (usable in a `static`).
    pub const fn new(cap: usize) -> Kept<K, V> {
        Kept { cap, map: Mutex::new(None) }
    }

    fn with<T>(&self, f: impl FnOnce(&mut HashMap<K, V>) -> T) -> T {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        f(map.get_or_insert_with(HashMap::new))
    }

    /// The value kept for `key` (or a borrowed form of it: a `&str` for a `String` key).
    pub fn get<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
    {
        self.with(|m| m.get(key).cloned())
    }

    /// Keeps `value` for `key`, emptying the cache first where it is full.
    pub fn insert(&self, key: K, value: V) {
        self.insert_all([(key, value)]);
    }

    /// Keeps every entry, in one step: emptied first where they would not all fit, so that none
    /// of them empties the cache of the others.
    pub fn insert_all<const N: usize>(&self, entries: [(K, V); N]) {
        let cap = self.cap;
        self.with(|m| {
            let new = entries.iter().filter(|(k, _)| !m.contains_key(k)).count();
            if m.len() + new > cap {
                m.clear();
            }
            m.extend(entries);
        });
    }

    /// The value kept for `key`, else `make()`'s, kept. `make` runs without the lock held, so
    /// that other keys are not held up by it (two threads making one key both make it; one
    /// value is kept, and each gets its own).
    pub fn get_or_try_insert<E>(&self, key: K, make: impl FnOnce() -> Result<V, E>) -> Result<V, E> {
        if let Some(v) = self.get(&key) {
            return Ok(v);
        }
        let v = make()?;
        self.insert(key, v.clone());
        Ok(v)
    }

    /// [`Kept::get_or_try_insert`] for a `make` that cannot fail.
    pub fn get_or_insert_with(&self, key: K, make: impl FnOnce() -> V) -> V {
        let Ok(v) = self.get_or_try_insert::<std::convert::Infallible>(key, || Ok(make()));
        v
    }

    /// The value kept for `key`, else `make()`'s, kept, made under the lock: every thread asking
    /// for one key gets the same value. For values cheap to make, such as a `OnceLock` that the
    /// callers then fill once (single-flight work keyed by the cache).
    pub fn shared(&self, key: K, make: impl FnOnce() -> V) -> V {
        self.with(|m| {
            if let Some(v) = m.get(&key) {
                return v.clone();
            }
            if m.len() >= self.cap {
                m.clear();
            }
            let v = make();
            m.insert(key, v.clone());
            v
        })
    }

    /// Entries kept now.
    pub fn len(&self) -> usize {
        self.with(|m| m.len())
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets every entry.
    pub fn clear(&self) {
        self.with(HashMap::clear);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_cache_starts_afresh_and_a_kept_key_is_replaced_in_place() {
        let k: Kept<u32, u32> = Kept::new(3);
        for i in 0..3 {
            k.insert(i, i * 10);
        }
        assert_eq!((k.len(), k.get(&2)), (3, Some(20)));
        k.insert(2, 21);
        assert_eq!((k.len(), k.get(&2)), (3, Some(21)), "a key kept already is no new entry");
        k.insert(3, 30);
        assert_eq!((k.len(), k.get(&0), k.get(&3)), (1, None, Some(30)));
        let made: Result<u32, ()> = k.get_or_try_insert(4, || Ok(40));
        assert_eq!((made, k.get_or_try_insert::<()>(4, || panic!("kept: not made again"))), (Ok(40), Ok(40)));
        assert_eq!(k.get_or_try_insert(5, || Err("refused")), Err("refused"));
        assert_eq!(k.get(&5), None, "an error is not kept");
        k.clear();
        assert!(k.is_empty());
        let both: Kept<String, u32> = Kept::new(2);
        both.insert("a".into(), 1);
        both.insert_all([("b".into(), 2), ("c".into(), 3)]);
        assert_eq!((both.len(), both.get("a"), both.get("b"), both.get("c")), (2, None, Some(2), Some(3)), "two new entries at once fit together");
    }

    #[test]
    fn threads_asking_for_one_shared_key_get_one_value() {
        use std::sync::{Arc, OnceLock};
        let k: Kept<u32, Arc<OnceLock<u32>>> = Kept::new(4);
        let made = std::sync::atomic::AtomicU32::new(0);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    let once = k.shared(7, || Arc::new(OnceLock::new()));
                    once.get_or_init(|| {
                        std::thread::sleep(std::time::Duration::from_millis(20));
                        made.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 100
                    });
                });
            }
        });
        assert_eq!(made.load(std::sync::atomic::Ordering::SeqCst), 1, "made once, however many threads asked");
        assert_eq!(k.shared(7, || panic!("kept: not made again")).get(), Some(&100));
    }
}
