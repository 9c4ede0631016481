//! tessel's plugin API: the kernel IR every side shares, and (in `abi`) the boundary a backend
//! plugin implements.
#![deny(missing_docs)]

pub mod array;
pub mod ir;
pub mod launch;
