//! tessel's plugin API: the kernel IR every side shares ([`ir`]), the ABI-stable boundary a backend
//! plugin implements ([`abi`]), and the plain-Rust side of it for backend authors ([`backend`]).
#![deny(missing_docs)]

pub mod abi;
pub mod array;
pub mod backend;
pub mod cancel;
pub mod clip;
pub mod ir;
pub mod kept;
pub mod launch;
pub mod libm;
pub mod mesh;
pub mod refusal;
