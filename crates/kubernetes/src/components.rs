//! The component installer (being written).
