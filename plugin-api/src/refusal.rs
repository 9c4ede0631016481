//! Refusals: what a backend will not run, typed. Each backend keeps its refusals in one enum
//! (`backends/*/src/error.rs`) whose `Display` is the first line, byte for byte the words DESIGN.md
//! gives (Pallas's own where Pallas has them), and whose [`Refusal::hint`] says what would work.
//! A refusal crosses the boundary as a [`BackendError`] of kind [`ErrorKind::Unsupported`]:
//! `first line`, a newline, two spaces, the hint.
//!
//! This module also holds the refusals every backend shares: those of [`crate::backend::verify_with_mesh`].

use crate::abi::{BackendError, ErrorKind};

/// A typed refusal: its `Display` is the first line, [`Refusal::hint`] the line after it.
pub trait Refusal: std::fmt::Display {
    /// What would work instead.
    fn hint(&self) -> String;

    /// The refusal as it crosses the boundary.
    fn into_error(self) -> BackendError
    where
        Self: Sized,
    {
        BackendError::new(ErrorKind::Unsupported, format!("{self}\n  {}", self.hint()))
    }
}

/// The refusals of a kernel and its mesh that every backend shares.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, strum::EnumDiscriminants)]
#[strum_discriminants(name(MeshRefusalKind), derive(strum::EnumIter, Hash))]
pub enum MeshRefusal {
    /// A kernel without a `grid` uses an axis the mesh does not name.
    #[error("kernel `{kernel}` uses axis `{axis}`, which the mesh {mesh} does not name")]
    MissingAxis {
        /// The kernel.
        kernel: String,
        /// The axis it uses.
        axis: String,
        /// The mesh's `Display`.
        mesh: String,
        /// Every axis the kernel uses.
        uses: Vec<String>,
    },
    /// A kernel's `grid` axis that is not the mesh's axis of that name and size.
    #[error("{axis} mixes mesh and grid axes")]
    MixesMeshAndGrid {
        /// The kernel.
        kernel: String,
        /// The grid axis.
        axis: String,
        /// Its size as written.
        size: String,
        /// The mesh's `Display`.
        mesh: String,
    },
}

impl Refusal for MeshRefusal {
    fn hint(&self) -> String {
        match self {
            MeshRefusal::MissingAxis { uses, .. } => {
                format!("give the mesh every axis the kernel uses: {}", uses.join(", "))
            }
            MeshRefusal::MixesMeshAndGrid { kernel, axis, size, mesh } => format!(
                "kernel `{kernel}` declares `{axis}: {size}` but the mesh is {mesh}; give every grid axis the mesh's name and size, or leave out `grid` to take the mesh's"
            ),
        }
    }
}

impl From<MeshRefusal> for BackendError {
    fn from(r: MeshRefusal) -> BackendError {
        r.into_error()
    }
}
