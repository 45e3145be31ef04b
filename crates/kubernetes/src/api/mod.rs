//! The Kubernetes API adapter (being written).
