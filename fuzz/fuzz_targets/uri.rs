//! KMS and storage URI parsers on arbitrary text: must never panic; whatever parses must
//! format to a URI that parses to the same thing (formatting is a fixed point); the parsed
//! forms never show a secret in `Debug`.
#![no_main]

use asterism_kms::{KmsUri, StorageUri};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(kms) = KmsUri::parse(text) {
        let formatted = kms.to_uri_string();
        let again = KmsUri::parse(&formatted).ok();
        assert_eq!(
            again.map(|k| k.to_uri_string()).as_deref(),
            Some(&*formatted)
        );
        let shown = format!("{kms:?}");
        if matches!(kms, KmsUri::Cluster(_)) {
            // The key and the salt, as written in the formatted URI, never appear in Debug.
            let query = formatted.split_once('?').map_or("", |(_, q)| q);
            for pair in query.split('&') {
                let value = pair.split_once('=').map_or("", |(_, v)| v);
                assert!(
                    !value.is_empty() && !shown.contains(value),
                    "Debug shows a secret"
                );
            }
        }
    }
    if let Ok(storage) = StorageUri::parse(text) {
        let formatted = storage.to_uri_string();
        assert_eq!(StorageUri::parse(&formatted).ok().as_ref(), Some(&storage));
    }
});
