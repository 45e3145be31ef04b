//! An error with its causes on one line, for logs and for the messages an authenticated
//! caller gets.

/// An error with its causes, `a: b: c`.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        out.push_str(": ");
        out.push_str(&e.to_string());
        source = e.source();
    }
    out
}

pub(crate) use error_chain as chain;
