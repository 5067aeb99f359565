//! Where a loop reads the time.
//!
//! A loop that decides by the clock (a deadline passed, a window elapsed)
//! takes a [`Clock`] instead of calling `Utc::now()`, so that a test can
//! hold time still or move it by hand with a [`ManualClock`] rather than
//! sleep. Services pass [`SystemClock`].

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};

/// A source of the current instant.
pub trait Clock: Send + Sync {
    fn now(&self) -> DateTime<Utc>;
}

/// A clock shared between the tasks of one service.
pub type SharedClock = Arc<dyn Clock>;

/// The wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl SystemClock {
    /// The wall clock, ready to share.
    pub fn shared() -> SharedClock {
        Arc::new(SystemClock)
    }
}

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A clock that moves only when told to, for tests. Clones share one time.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<Mutex<DateTime<Utc>>>);

impl ManualClock {
    pub fn new(at: DateTime<Utc>) -> Self {
        Self(Arc::new(Mutex::new(at)))
    }

    pub fn set(&self, at: DateTime<Utc>) {
        *self.0.lock().expect("clock") = at;
    }

    /// Moves the time on by `by` and returns the new instant.
    pub fn advance(&self, by: Duration) -> DateTime<Utc> {
        let mut at = self.0.lock().expect("clock");
        *at += chrono::Duration::from_std(by).expect("duration in range");
        *at
    }

    /// This clock, shared: the clone moves with it.
    pub fn shared(&self) -> SharedClock {
        Arc::new(self.clone())
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.0.lock().expect("clock")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t0() -> DateTime<Utc> {
        "2026-12-01T00:00:00Z".parse().unwrap()
    }

    #[test]
    fn a_manual_clock_stands_still_until_moved() {
        let clock = ManualClock::new(t0());
        assert_eq!(clock.now(), t0());
        assert_eq!(clock.now(), t0());
        let later = clock.advance(Duration::from_millis(1_500));
        assert_eq!(later, t0() + chrono::Duration::milliseconds(1_500));
        assert_eq!(clock.now(), later);
        clock.set(t0());
        assert_eq!(clock.now(), t0());
    }

    #[test]
    fn clones_and_shared_handles_read_one_time() {
        let clock = ManualClock::new(t0());
        let copy = clock.clone();
        let shared = clock.shared();
        clock.advance(Duration::from_secs(60));
        assert_eq!(copy.now(), t0() + chrono::Duration::seconds(60));
        assert_eq!(shared.now(), t0() + chrono::Duration::seconds(60));
        copy.set(t0());
        assert_eq!(shared.now(), t0());
    }

    #[test]
    fn the_system_clock_follows_the_wall_clock() {
        let before = Utc::now();
        let read = SystemClock::shared().now();
        assert!(before <= read && read <= Utc::now());
    }
}
