//! The shape every cache of the read model shares: what it holds, and a
//! generation that moves on each time the projection's runner makes some
//! of it stale. A read of the database begins under the generation it
//! finds and is kept only if the generation has not moved since, so a
//! read that raced a commit never puts an older row back. Which commits
//! move which cache on is decided in one place, `invalidation.rs`.

use std::ops::{Deref, DerefMut};

use crate::poison_free::PoisonFreeRwLock;

/// A cache's contents and its generation, behind a lock that survives a
/// panic elsewhere.
pub type GenerationalCache<T> = PoisonFreeRwLock<Generational<T>>;

/// What a cache holds, stamped with its generation.
#[derive(Debug, Default)]
pub struct Generational<T> {
    generation: u64,
    entries: T,
}

impl<T> Generational<T> {
    /// The generation a read of the database starts under.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether nothing made the cache stale since a read began under
    /// `read_under`: only then may what it read be kept.
    pub fn is_current(&self, read_under: u64) -> bool {
        self.generation == read_under
    }

    /// Marks what any read begun before now may have missed: fills begun
    /// under an earlier generation are dropped.
    pub fn move_on(&mut self) -> u64 {
        self.generation += 1;
        self.generation
    }
}

impl<T> Deref for Generational<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.entries
    }
}

impl<T> DerefMut for Generational<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.entries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_begun_before_the_generation_moved_on_is_not_current() {
        let cache: GenerationalCache<Vec<u32>> = GenerationalCache::default();
        let before = cache.read().generation();
        cache.write().push(1);
        assert!(cache.read().is_current(before), "a fill is not a commit");
        let now = cache.write().move_on();
        assert!(!cache.read().is_current(before));
        assert!(cache.read().is_current(now));
        assert_eq!(cache.read().len(), 1);
    }
}
