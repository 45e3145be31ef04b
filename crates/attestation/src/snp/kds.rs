//! Where AMD's Key Distribution Service (KDS) serves the certificates of a chip, so that a
//! node or an operator can fetch them ahead of verification. Nothing here fetches.

use super::{Product, RawTcb};

/// The KDS base URL.
pub const KDS_BASE: &str = "https://kdsintf.amd.com";

/// The URL of the VCEK for `chip_id` at `tcb` (the report's `reported_tcb`):
/// `https://kdsintf.amd.com/vcek/v1/{product}/{hwid}?blSPL=…&teeSPL=…&snpSPL=…&ucodeSPL=…`,
/// with `&fmcSPL=…` added on Turin. `hwid` is the chip ID in lower-case hex: all 64 bytes,
/// or the first 8 on Turin. The SPLs are decimal.
pub fn vcek_url(product: Product, chip_id: &[u8; 64], tcb: RawTcb) -> String {
    let t = tcb.parts(product);
    let hwid = match product {
        Product::Turin => hex::encode(chip_id.get(..8).unwrap_or_default()),
        Product::Milan | Product::Genoa => hex::encode(chip_id),
    };
    let mut url = format!(
        "{KDS_BASE}/vcek/v1/{product}/{hwid}?blSPL={}&teeSPL={}&snpSPL={}&ucodeSPL={}",
        t.bootloader, t.tee, t.snp, t.microcode
    );
    if let Some(fmc) = t.fmc {
        url.push_str(&format!("&fmcSPL={fmc}"));
    }
    url
}

/// The URL of the ASK and ARK (PEM, ASK first) that certify VCEKs of `product`.
pub fn vcek_chain_url(product: Product) -> String {
    format!("{KDS_BASE}/vcek/v1/{product}/cert_chain")
}

/// The URL of the ASVK and ARK (PEM, ASVK first) that certify VLEKs of `product`. VLEKs
/// themselves are issued to cloud providers, who hand them to their guests; KDS does not
/// serve them publicly.
pub fn vlek_chain_url(product: Product) -> String {
    format!("{KDS_BASE}/vlek/v1/{product}/cert_chain")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turin_urls_use_the_short_hwid_and_add_the_fmc() {
        let mut chip = [0u8; 64];
        chip[..8].copy_from_slice(&[0x1e, 0x55, 0x0a, 0x8e, 0xe5, 0xcf, 0x9f, 0x4d]);
        let tcb = RawTcb([1, 2, 3, 4, 0, 0, 0, 0x09]);
        assert_eq!(
            vcek_url(Product::Turin, &chip, tcb),
            "https://kdsintf.amd.com/vcek/v1/Turin/1e550a8ee5cf9f4d?blSPL=2&teeSPL=3&snpSPL=4&ucodeSPL=9&fmcSPL=1"
        );
    }

    #[test]
    fn milan_urls_use_the_whole_chip_id() {
        let chip = [0xab; 64];
        let tcb = RawTcb([3, 0, 0, 0, 0, 0, 8, 115]);
        assert_eq!(
            vcek_url(Product::Milan, &chip, tcb),
            format!(
                "https://kdsintf.amd.com/vcek/v1/Milan/{}?blSPL=3&teeSPL=0&snpSPL=8&ucodeSPL=115",
                "ab".repeat(64)
            )
        );
        assert_eq!(
            vlek_chain_url(Product::Genoa),
            "https://kdsintf.amd.com/vlek/v1/Genoa/cert_chain"
        );
    }
}
