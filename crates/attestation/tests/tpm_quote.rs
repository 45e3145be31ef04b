//! TPM quote validation tests.
