//! Typed value ids: the verifier numbers every value of a kernel (`%x` of a statement's results,
//! a `for`'s induction variable and carried values) in the order it defines them, and keeps their
//! names and types in one table ([`ValueTable`]). Plans then keep what they decide about values
//! in vectors indexed by id ([`ValueMap`], [`ValueSet`]), not in maps keyed by name, and iterate
//! them in definition order, the same on every run.

use std::collections::HashMap;
use std::fmt;

use super::Type;

/// A value of a verified kernel: its position in definition order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(u32);

impl ValueId {
    /// The id's position in its table.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

/// Every value of a kernel: names and types by id, ids by name.
#[derive(Clone, Debug, Default)]
pub struct ValueTable {
    names: Vec<String>,
    types: Vec<Type>,
    ids: HashMap<String, ValueId>,
}

impl ValueTable {
    /// Adds the value `name` of type `ty` (names are unique within a kernel: the verifier refuses a
    /// second definition before it gets here); returns its id.
    pub(super) fn define(&mut self, name: &str, ty: Type) -> ValueId {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = ValueId(u32::try_from(self.names.len()).expect("fewer than 2^32 values in a kernel"));
        self.names.push(name.to_string());
        self.types.push(ty);
        self.ids.insert(name.to_string(), id);
        id
    }

    /// The id of `%name`, if the kernel defines it.
    pub fn get(&self, name: &str) -> Option<ValueId> {
        self.ids.get(name).copied()
    }

    /// The id of `%name`; the kernel must define it.
    pub fn id(&self, name: &str) -> ValueId {
        self.get(name).unwrap_or_else(|| panic!("verified kernel has no value %{name}"))
    }

    /// The value's name (without `%`).
    pub fn name(&self, id: ValueId) -> &str {
        &self.names[id.index()]
    }

    /// The value's type.
    pub fn ty(&self, id: ValueId) -> &Type {
        &self.types[id.index()]
    }

    /// How many values the kernel has.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether the kernel has no values.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Every id, in definition order.
    pub fn ids(&self) -> impl Iterator<Item = ValueId> + use<> {
        (0..self.names.len() as u32).map(ValueId)
    }
}

/// What a plan knows about some of a kernel's values, indexed by id; iterates in definition order.
/// Two are equal when they hold the same entries.
#[derive(Clone, Debug)]
pub struct ValueMap<T> {
    slots: Vec<Option<T>>,
    len: usize,
}

impl<T: PartialEq> PartialEq for ValueMap<T> {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl<T> Default for ValueMap<T> {
    fn default() -> Self {
        ValueMap { slots: Vec::new(), len: 0 }
    }
}

impl<T> ValueMap<T> {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the entry of `id`; returns the one it replaces.
    pub fn insert(&mut self, id: ValueId, value: T) -> Option<T> {
        if self.slots.len() <= id.index() {
            self.slots.resize_with(id.index() + 1, || None);
        }
        let old = self.slots[id.index()].replace(value);
        self.len += usize::from(old.is_none());
        old
    }

    /// The entry of `id`.
    pub fn get(&self, id: ValueId) -> Option<&T> {
        self.slots.get(id.index()).and_then(Option::as_ref)
    }

    /// The entry of `id`, to change.
    pub fn get_mut(&mut self, id: ValueId) -> Option<&mut T> {
        self.slots.get_mut(id.index()).and_then(Option::as_mut)
    }

    /// Removes the entry of `id`.
    pub fn remove(&mut self, id: ValueId) -> Option<T> {
        let old = self.slots.get_mut(id.index()).and_then(Option::take);
        self.len -= usize::from(old.is_some());
        old
    }

    /// Whether `id` has an entry.
    pub fn contains_key(&self, id: ValueId) -> bool {
        self.get(id).is_some()
    }

    /// How many entries.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The entries, in definition order.
    pub fn iter(&self) -> impl Iterator<Item = (ValueId, &T)> {
        self.slots.iter().enumerate().filter_map(|(i, v)| v.as_ref().map(|v| (ValueId(i as u32), v)))
    }

    /// The ids with entries, in definition order.
    pub fn keys(&self) -> impl Iterator<Item = ValueId> + '_ {
        self.iter().map(|(id, _)| id)
    }

    /// The entries' values, in definition order.
    pub fn values(&self) -> impl Iterator<Item = &T> {
        self.iter().map(|(_, v)| v)
    }
}

impl<T> std::ops::Index<ValueId> for ValueMap<T> {
    type Output = T;

    /// The entry of `id`, which must have one.
    fn index(&self, id: ValueId) -> &T {
        self.get(id).unwrap_or_else(|| panic!("no entry for value {id}"))
    }
}

impl<T> FromIterator<(ValueId, T)> for ValueMap<T> {
    fn from_iter<I: IntoIterator<Item = (ValueId, T)>>(iter: I) -> Self {
        let mut map = ValueMap::new();
        for (id, v) in iter {
            map.insert(id, v);
        }
        map
    }
}

/// A set of a kernel's values; iterates in definition order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ValueSet(ValueMap<()>);

impl ValueSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `id`; whether it was not there.
    pub fn insert(&mut self, id: ValueId) -> bool {
        self.0.insert(id, ()).is_none()
    }

    /// Whether `id` is in the set.
    pub fn contains(&self, id: ValueId) -> bool {
        self.0.contains_key(id)
    }

    /// Removes `id`; whether it was there.
    pub fn remove(&mut self, id: ValueId) -> bool {
        self.0.remove(id).is_some()
    }

    /// How many ids.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The ids, in definition order.
    pub fn iter(&self) -> impl Iterator<Item = ValueId> + '_ {
        self.0.keys()
    }
}

impl FromIterator<ValueId> for ValueSet {
    fn from_iter<I: IntoIterator<Item = ValueId>>(iter: I) -> Self {
        let mut set = ValueSet::new();
        for id in iter {
            set.insert(id);
        }
        set
    }
}

impl Extend<ValueId> for ValueSet {
    fn extend<I: IntoIterator<Item = ValueId>>(&mut self, iter: I) {
        for id in iter {
            self.insert(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::DType;

    #[test]
    fn ids_follow_definition_order_and_maps_iterate_in_it() {
        let mut t = ValueTable::default();
        let f = Type { dtype: DType::F32, shape: vec![4] };
        let (b, a, c) = (t.define("b", f.clone()), t.define("a", Type::scalar(DType::I32)), t.define("c", f.clone()));
        assert_eq!((b.index(), a.index(), c.index()), (0, 1, 2));
        assert_eq!(t.define("a", f.clone()), a, "a name keeps its id");
        assert_eq!((t.name(a), t.ty(a).dtype, t.id("c")), ("a", DType::I32, c));
        assert_eq!(t.get("d"), None);
        let mut m: ValueMap<&str> = [(c, "c"), (b, "b")].into_iter().collect();
        assert_eq!(m.values().copied().collect::<Vec<_>>(), ["b", "c"]);
        assert_eq!((m.len(), m.insert(c, "c2"), m.len()), (2, Some("c"), 2));
        assert_eq!((m.remove(b), m.remove(b), m.len(), m.contains_key(a)), (Some("b"), None, 1, false));
        let s: ValueSet = [c, a, c].into_iter().collect();
        assert_eq!((s.len(), s.iter().collect::<Vec<_>>()), (2, vec![a, c]));
        let mut grown = ValueSet::new();
        grown.insert(c);
        grown.remove(c);
        assert_eq!(grown, ValueSet::new(), "equal by entries, not by the room they took");
    }
}
