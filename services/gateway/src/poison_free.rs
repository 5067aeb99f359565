//! A lock over what the gateway keeps in memory beside its read model,
//! that a panic elsewhere does not take down with it.

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A read-write lock whose data stays usable after a panic elsewhere: the
/// caches behind it are never left half-changed (no method that changes
/// them panics half-way), so a poisoned lock is used as it is rather than
/// taking the gateway's reads down with it.
#[derive(Default)]
pub struct PoisonFreeRwLock<T>(RwLock<T>);

impl<T> PoisonFreeRwLock<T> {
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        self.0.read().unwrap_or_else(|p| p.into_inner())
    }

    pub fn write(&self) -> RwLockWriteGuard<'_, T> {
        self.0.write().unwrap_or_else(|p| p.into_inner())
    }
}
