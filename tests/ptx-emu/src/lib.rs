//! A small emulator for the subset of PTX that tessel's Mosaic GPU backend emits, so that the
//! lowering can be checked against the reference interpreter on machines without a GPU.
//!
//! It is a test tool, not a GPU model: CTAs run one after another; inside a CTA every thread runs
//! until it reaches `bar.sync`, a warp-wide `mma.sync` or `ret`, in thread order or in reverse
//! thread order, so a missing barrier shows up as a difference between the two orders. A barrier
//! (`bar.sync 0` for the whole CTA, `bar.sync id, count` for `count` threads) opens when as many
//! threads as it expects wait at it; a warp's `mma.sync` runs once all 32 lanes reach it. Dynamic
//! shared memory starts filled with a NaN pattern, as a GPU's starts with whatever was there, so
//! a read before a write shows. There are no approximate instructions (`ex2.approx`,
//! `sin.approx`, ...): their error is the hardware's, which an emulator cannot know, so the
//! backend writes its maths from exactly rounded ones and a use of them here is an error.
//! Tensor-core products are summed in `f64` and rounded once; the tests compare within
//! tolerances. An instruction outside the subset is an error naming it, never a
//! silent guess.
//!
//! The `mma` fragment layouts follow the PTX ISA's tables ("Matrix Fragments for mma.m16n8k8" and
//! "... mma.m16n8k16 with floating point type"): they are written here once, as the ISA states
//! them, apart from the backend's emitter.
//!
//! The files: `parse.rs` reads the PTX text into a [`Module`]; `memory.rs` holds the bytes of
//! global and shared memory ([`Memory`]); `cta.rs` the state threads and CTAs run on and the
//! [`Counts`] of a launch; `exec.rs` executes instructions; `launch.rs` schedules a launch's
//! threads ([`Module::launch`]); `hopper.rs` models the Hopper asynchronous instructions.

mod cta;
mod exec;
mod hopper;
mod launch;
mod memory;
mod parse;

pub use cta::Counts;
pub use hopper::{TensorMap, swizzle};
pub use memory::Memory;
pub use parse::{Module, parse};
