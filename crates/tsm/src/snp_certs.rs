//! The SEV-SNP certificate table the host attaches to an extended report (configfs-tsm's
//! `auxblob` from `sev_guest`), as the GHCB specification defines it: entries of a 16-byte
//! GUID, a little-endian u32 offset and a u32 length, ended by an all-zero entry; each
//! certificate (DER) lies at its offset from the start of the table.
//!
//! The table may be followed by unused, zero-filled buffer space, so bytes after the last
//! certificate are not an error; every entry's bounds are checked exactly.

use std::collections::BTreeSet;

const ENTRY_SIZE: usize = 24;

/// Which certificate an entry holds, by its GUID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CertKind {
    /// Versioned Chip Endorsement Key, `63da758d-e664-4564-adc5-f4b93be8accd`.
    Vcek,
    /// Versioned Loaded Endorsement Key, `a8074bc2-a25a-483e-aae6-39c045a0b8a1`.
    Vlek,
    /// AMD SEV Key (or, for a VLEK, the ASVK), `4ab7b379-bbac-4fe4-a02f-05aef327c782`.
    Ask,
    /// AMD Root Key, `c0b406a4-a803-4952-9743-3fb6014cd0ae`.
    Ark,
    /// A GUID this crate does not know (a host may attach more, such as a CRL), as its
    /// 16 bytes in the table's (string) order.
    Other([u8; 16]),
}

/// GUIDs in the byte order the table carries them: the order of the text form, which the
/// digit groups of each literal follow.
const KNOWN: [([u8; 16], CertKind); 4] = [
    (
        0x63da758d_e664_4564_adc5_f4b93be8accd_u128.to_be_bytes(),
        CertKind::Vcek,
    ),
    (
        0xa8074bc2_a25a_483e_aae6_39c045a0b8a1_u128.to_be_bytes(),
        CertKind::Vlek,
    ),
    (
        0x4ab7b379_bbac_4fe4_a02f_05aef327c782_u128.to_be_bytes(),
        CertKind::Ask,
    ),
    (
        0xc0b406a4_a803_4952_9743_3fb6014cd0ae_u128.to_be_bytes(),
        CertKind::Ark,
    ),
];

impl CertKind {
    /// The kind a GUID (16 bytes, table order) names.
    pub fn from_guid(guid: [u8; 16]) -> Self {
        KNOWN
            .iter()
            .find(|(g, _)| *g == guid)
            .map_or(CertKind::Other(guid), |(_, kind)| *kind)
    }

    /// The GUID's 16 bytes as the table carries them.
    pub fn guid(self) -> [u8; 16] {
        match self {
            CertKind::Other(guid) => guid,
            known => KNOWN
                .iter()
                .find(|(_, k)| *k == known)
                .map_or([0; 16], |(g, _)| *g),
        }
    }
}

/// Why a certificate table was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertTableError {
    /// The blob ends before the all-zero entry that ends the table.
    #[error("SNP certificate table: no terminating all-zero entry within {len} bytes")]
    NoTerminator {
        /// The blob's length.
        len: usize,
    },
    /// An entry with a zero GUID but a non-zero offset or length.
    #[error(
        "SNP certificate table: entry {index} has a zero GUID but offset {offset}, length {length}"
    )]
    BadTerminator {
        /// Entry number, from 0.
        index: usize,
        /// Its offset.
        offset: u32,
        /// Its length.
        length: u32,
    },
    /// A certificate outside the blob, inside the table, or empty.
    #[error(
        "SNP certificate table: entry {index} ({kind:?}) at offset {offset}, length {length} \
         is not within the {len} bytes after the {table_end}-byte table"
    )]
    OutOfBounds {
        /// Entry number, from 0.
        index: usize,
        /// The entry's kind.
        kind: CertKind,
        /// Its offset.
        offset: u32,
        /// Its length.
        length: u32,
        /// Where the table (terminator included) ends.
        table_end: usize,
        /// The blob's length.
        len: usize,
    },
    /// Two entries of the same kind: which one the report was signed with is ambiguous.
    #[error("SNP certificate table: more than one {0:?} certificate")]
    Duplicate(CertKind),
}

fn u32_le(bytes: &[u8]) -> u32 {
    let mut raw = [0u8; 4];
    if let Some(src) = bytes.get(..4) {
        raw.copy_from_slice(src);
    }
    u32::from_le_bytes(raw)
}

/// Splits a certificate table into its certificates, in table order.
pub fn parse_snp_cert_table(blob: &[u8]) -> Result<Vec<(CertKind, Vec<u8>)>, CertTableError> {
    let mut entries = Vec::new();
    let mut chunks = blob.chunks_exact(ENTRY_SIZE);
    let table_end = loop {
        let Some(entry) = chunks.next() else {
            return Err(CertTableError::NoTerminator { len: blob.len() });
        };
        let (guid, rest) = entry.split_at(16);
        let mut g = [0u8; 16];
        g.copy_from_slice(guid);
        let (offset, length) = (u32_le(rest), u32_le(rest.get(4..).unwrap_or_default()));
        if g == [0; 16] {
            if offset != 0 || length != 0 {
                return Err(CertTableError::BadTerminator {
                    index: entries.len(),
                    offset,
                    length,
                });
            }
            break (entries.len() + 1) * ENTRY_SIZE;
        }
        entries.push((CertKind::from_guid(g), offset, length));
    };

    let mut seen = BTreeSet::new();
    let mut certs = Vec::with_capacity(entries.len());
    for (index, (kind, offset, length)) in entries.into_iter().enumerate() {
        let out_of_bounds = CertTableError::OutOfBounds {
            index,
            kind,
            offset,
            length,
            table_end,
            len: blob.len(),
        };
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        let end = usize::try_from(length)
            .ok()
            .and_then(|l| start.checked_add(l));
        let der = match end {
            Some(end) if length > 0 && start >= table_end => blob.get(start..end),
            _ => None,
        }
        .ok_or(out_of_bounds)?;
        if !seen.insert(kind) {
            return Err(CertTableError::Duplicate(kind));
        }
        certs.push((kind, der.to_vec()));
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {

    use super::*;

    /// Builds a table of `certs` followed by the terminator and the certificates.
    fn table(certs: &[([u8; 16], &[u8])]) -> Vec<u8> {
        let mut head = Vec::new();
        let mut body = Vec::new();
        let table_len = (certs.len() + 1) * ENTRY_SIZE;
        for (guid, der) in certs {
            head.extend_from_slice(guid);
            let offset = u32::try_from(table_len + body.len()).unwrap();
            head.extend_from_slice(&offset.to_le_bytes());
            head.extend_from_slice(&u32::try_from(der.len()).unwrap().to_le_bytes());
            body.extend_from_slice(der);
        }
        head.extend_from_slice(&[0; ENTRY_SIZE]);
        head.extend_from_slice(&body);
        head
    }

    #[test]
    fn guids_are_the_text_forms_bytes_in_order() {
        // The byte order of the text form: what AMD's tools and the kernel's users write.
        let hex = |k: CertKind| {
            k.guid()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        };
        assert_eq!(hex(CertKind::Vcek), "63da758de6644564adc5f4b93be8accd");
        assert_eq!(hex(CertKind::Vlek), "a8074bc2a25a483eaae639c045a0b8a1");
        assert_eq!(hex(CertKind::Ask), "4ab7b379bbac4fe4a02f05aef327c782");
        assert_eq!(hex(CertKind::Ark), "c0b406a4a803495297433fb6014cd0ae");
    }

    #[test]
    fn splits_a_table_into_kind_and_der() {
        let other = [7u8; 16];
        let mut blob = table(&[
            (CertKind::Vcek.guid(), b"vcek-der"),
            (CertKind::Ask.guid(), b"ask"),
            (CertKind::Ark.guid(), b"ark-der!"),
            (other, b"crl"),
        ]);
        // Unused, zero-filled buffer after the certificates is allowed.
        blob.extend_from_slice(&[0; 100]);
        let certs = parse_snp_cert_table(&blob).unwrap();
        assert_eq!(
            certs,
            vec![
                (CertKind::Vcek, b"vcek-der".to_vec()),
                (CertKind::Ask, b"ask".to_vec()),
                (CertKind::Ark, b"ark-der!".to_vec()),
                (CertKind::Other(other), b"crl".to_vec()),
            ]
        );
        assert_eq!(parse_snp_cert_table(&[0; ENTRY_SIZE]).unwrap(), vec![]);
    }

    #[test]
    fn refuses_a_table_without_terminator() {
        let blob = table(&[(CertKind::Vlek.guid(), b"vlek")]);
        // Cut inside the terminator.
        let cut = &blob[..2 * ENTRY_SIZE - 1];
        assert_eq!(
            parse_snp_cert_table(cut),
            Err(CertTableError::NoTerminator { len: cut.len() })
        );
        assert_eq!(
            parse_snp_cert_table(&[]),
            Err(CertTableError::NoTerminator { len: 0 })
        );
    }

    #[test]
    fn refuses_certificates_out_of_bounds_by_one_byte() {
        let blob = table(&[(CertKind::Vcek.guid(), b"vcek")]);
        // Exactly the table: the certificate's last byte missing.
        let short = &blob[..blob.len() - 1];
        assert!(matches!(
            parse_snp_cert_table(short),
            Err(CertTableError::OutOfBounds {
                index: 0,
                kind: CertKind::Vcek,
                ..
            })
        ));
        // Offset into the table itself, zero length, and an overflowing length.
        for (offset, length) in [(47u32, 4u32), (48, 0), (48, u32::MAX)] {
            let mut b = blob.clone();
            b[16..20].copy_from_slice(&offset.to_le_bytes());
            b[20..24].copy_from_slice(&length.to_le_bytes());
            assert!(
                matches!(
                    parse_snp_cert_table(&b),
                    Err(CertTableError::OutOfBounds { .. })
                ),
                "offset {offset} length {length}"
            );
        }
    }

    #[test]
    fn refuses_a_zero_guid_with_an_offset_and_duplicates() {
        let mut blob = table(&[(CertKind::Vcek.guid(), b"vcek")]);
        blob[ENTRY_SIZE + 20] = 1;
        assert!(matches!(
            parse_snp_cert_table(&blob),
            Err(CertTableError::BadTerminator { index: 1, .. })
        ));
        let dup = table(&[(CertKind::Ask.guid(), b"a"), (CertKind::Ask.guid(), b"b")]);
        assert_eq!(
            parse_snp_cert_table(&dup),
            Err(CertTableError::Duplicate(CertKind::Ask))
        );
    }
}
