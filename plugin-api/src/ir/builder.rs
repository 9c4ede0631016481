//! Builder
