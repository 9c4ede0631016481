//! How often this process has parsed kernel text, verified kernels and had a backend plan a
//! launch: what the launch-path tests pin (a cold launch parses its text once in the host and
//! once in each backend asked, verifies once in each, and each backend asked plans once).
//! Process-wide (built-in backends count here too; a plugin counts in its own copy); read the
//! difference across the work measured.

use std::sync::atomic::{AtomicU64, Ordering};

static PARSES: AtomicU64 = AtomicU64::new(0);
static VERIFIES: AtomicU64 = AtomicU64::new(0);
static PLANS: AtomicU64 = AtomicU64::new(0);
static DERIVED: AtomicU64 = AtomicU64::new(0);

/// The counts so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Kernel texts parsed (a file of several kernels parsed at once counts once).
    pub parses: u64,
    /// Kernels verified.
    pub verifies: u64,
    /// Launches planned by a backend (`BackendImpl::supports`).
    pub plans: u64,
    /// Kernels a backend derived from verified ones and verified (`verify_derived`).
    pub derived: u64,
}

impl std::ops::Sub for Counts {
    type Output = Counts;
    fn sub(self, earlier: Counts) -> Counts {
        Counts {
            parses: self.parses - earlier.parses,
            verifies: self.verifies - earlier.verifies,
            plans: self.plans - earlier.plans,
            derived: self.derived - earlier.derived,
        }
    }
}

/// The counts so far.
pub fn counts() -> Counts {
    Counts {
        parses: PARSES.load(Ordering::Relaxed),
        verifies: VERIFIES.load(Ordering::Relaxed),
        plans: PLANS.load(Ordering::Relaxed),
        derived: DERIVED.load(Ordering::Relaxed),
    }
}

pub(crate) fn parsed() {
    PARSES.fetch_add(1, Ordering::Relaxed);
}

pub(crate) fn verified() {
    VERIFIES.fetch_add(1, Ordering::Relaxed);
}

/// Counts a backend's plan of a launch (the plugin adapter calls it).
pub fn planned() {
    PLANS.fetch_add(1, Ordering::Relaxed);
}

pub(crate) fn derived() {
    DERIVED.fetch_add(1, Ordering::Relaxed);
}
