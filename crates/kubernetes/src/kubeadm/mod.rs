//! kubeadm configuration and runner (being written).
