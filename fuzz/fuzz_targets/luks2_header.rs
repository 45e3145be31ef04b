//! The LUKS2 header validator on arbitrary metadata JSON: must never panic, whatever it
//! accepts must satisfy the rules it promises, and the token a validated header reports must
//! be the one the lenient token reader sees.
#![no_main]

use asterism_disk::{IntegrityRule, MAX_KEYSLOTS, read_token_state, validate_header};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(json) = std::str::from_utf8(data) else {
        return;
    };
    let token = read_token_state(json);
    let optional = validate_header(json, IntegrityRule::Optional);
    let required = validate_header(json, IntegrityRule::Required);
    if let Ok(h) = &required {
        // Required integrity is the stricter rule: it accepts only headers with integrity,
        // and only headers the optional rule accepts too.
        assert!(h.integrity());
        assert!(optional.is_ok());
    }
    if let Ok(h) = optional {
        let slots = h.keyslots();
        assert!(!slots.is_empty() && slots.len() <= MAX_KEYSLOTS);
        assert!(
            slots.windows(2).all(|w| w[0] < w[1]),
            "keyslots sorted and unique"
        );
        if let Some(free) = h.free_keyslot() {
            assert!(!slots.contains(&free));
        }
        assert_eq!(h.token(), token);
    }
});
