//! A machine whose attestation key no one has certified yet is enrolled by its TPM's
//! endorsement key (docs/provisioning.md, "Enrolling machines with real TPMs"), and then
//! joins: the four `asterism-provision enroll` steps as real processes against the worker's
//! running swtpm, whose EK certificate the cluster's TPM manufacturer CA signed.

use crate::common::{TestCluster, bins, runtime};
use std::path::Path;
use std::process::Command;

fn provision(args: &[&dyn AsRef<std::ffi::OsStr>]) {
    let out = asterism_children::output(
        Command::new(bins().join("asterism-provision")).args(args.iter().map(|a| a.as_ref())),
    )
    .unwrap();
    assert!(
        out.status.success(),
        "asterism-provision {:?}: {}",
        args.iter()
            .map(|a| a.as_ref().to_owned())
            .collect::<Vec<_>>(),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_machine_enrolled_by_its_endorsement_key_gets_its_ak_certificate_and_joins() {
    let cluster = TestCluster::create(1, 45);
    let rt = runtime();
    let (_, cp) = rt.block_on(cluster.init()).unwrap();
    assert_eq!(cp.1, "ok");
    let worker = cluster.nodes[1].clone();

    // The machine has its TPM and its attestation key, but no certificate for the key.
    let attestation = worker.dir.join("attestation");
    let ak_public = std::fs::read(attestation.join("ak-public.bin")).unwrap();
    std::fs::remove_file(attestation.join("ak-cert.der")).unwrap();

    // The owner's bundle: the TPM manufacturer's root and EK-signing CA, certificates only.
    let ca_dir = cluster.platform_ca.parent().unwrap();
    let owner = cluster.scratch_dir().join("owner");
    let bundle = owner.join("ek-bundle");
    std::fs::create_dir_all(&bundle).unwrap();
    for (from, to) in [
        ("swtpm-localca-rootca-cert.pem", "root.pem"),
        ("issuercert.pem", "ek-ca.pem"),
    ] {
        std::fs::copy(ca_dir.join("ek-ca").join(from), bundle.join(to)).unwrap();
    }
    let file = |name: &str| owner.join(name);
    let tpm: &dyn AsRef<std::ffi::OsStr> = &worker.tcti;
    provision(&[
        &"enroll",
        &"request",
        &"--tpm",
        tpm,
        &"--out",
        &file("request.json"),
    ]);
    provision(&[
        &"enroll",
        &"challenge",
        &"--request",
        &file("request.json"),
        &"--ek-ca-dir",
        &bundle,
        &"--pending",
        &file("pending.json"),
        &"--out",
        &file("challenge.json"),
    ]);
    provision(&[
        &"enroll",
        &"activate",
        &"--tpm",
        tpm,
        &"--challenge",
        &file("challenge.json"),
        &"--out",
        &file("response.json"),
    ]);
    let certified = owner.join("certified");
    provision(&[
        &"enroll",
        &"finish",
        &"--pending",
        &file("pending.json"),
        &"--response",
        &file("response.json"),
        &"--ca-dir",
        &ca_dir,
        &"--out",
        &certified,
    ]);
    assert!(!Path::new(&file("pending.json")).exists(), "used up");
    // The certificate is for the key the node attests with.
    assert_eq!(
        std::fs::read(certified.join("ak-public.bin")).unwrap(),
        ak_public
    );
    std::fs::copy(
        certified.join("ak-cert.der"),
        attestation.join("ak-cert.der"),
    )
    .unwrap();

    // The enrolled machine joins with it.
    cluster.start_key_service().unwrap();
    cluster.start_join_service().unwrap();
    let b = cluster.start_bootstrapper(&worker).unwrap();
    let (_, exit) = rt
        .block_on(cluster.finish_bootstrapper(b, &worker))
        .unwrap();
    assert_eq!(exit, "ok", "the enrolled worker joins");
}
