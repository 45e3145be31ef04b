//! Reproduces every HKDF test vector and end-to-end value of the reference, byte for byte,
//! from `tests/data/hkdf-vectors.json`.

#![cfg(test)] // all of it test code: clippy.toml's test allowances cover its helpers too

use asterism_kms::{
    ClusterKms, DataKey, KeyId, MEASUREMENT_SALT_LEN, MasterSecret, Salt, derive, derive_cluster_id,
};
use serde::Deserialize;

#[derive(Deserialize)]
struct File {
    vectors: Vec<Vector>,
    end_to_end: EndToEnd,
}

#[derive(Deserialize)]
struct Vector {
    name: String,
    secret: String,
    salt: String,
    info_prefix: String,
    #[serde(default)]
    info_hex: Option<String>,
    #[serde(default)]
    info: Option<String>,
    length: usize,
    output: String,
}

impl Vector {
    fn info_bytes(&self) -> Vec<u8> {
        let mut info = self.info_prefix.as_bytes().to_vec();
        match (&self.info_hex, &self.info) {
            (Some(h), None) => info.extend(hex::decode(h).unwrap()),
            (None, Some(text)) => info.extend(text.as_bytes()),
            _ => panic!("{}: exactly one of info_hex and info", self.name),
        }
        info
    }
}

#[derive(Deserialize)]
struct EndToEnd {
    master_secret: String,
    salt: String,
    measurement_secret: String,
    measurement_salt: String,
    cluster_id: String,
    ssh_ca_seed: String,
}

fn load() -> File {
    let text = include_str!("data/hkdf-vectors.json");
    serde_json::from_str(text).unwrap()
}

fn h(text: &str) -> Vec<u8> {
    hex::decode(text).unwrap()
}

fn cluster_kms(secret: &str, salt: &str) -> ClusterKms {
    ClusterKms::new(
        MasterSecret::new(h(secret)).unwrap(),
        Salt::new(h(salt)).unwrap(),
    )
}

#[test]
fn every_reference_vector_is_reproduced_by_generic_derive() {
    let file = load();
    assert_eq!(file.vectors.len(), 7, "the reference lists seven vectors");
    for v in &file.vectors {
        let out = derive(&h(&v.secret), &h(&v.salt), &v.info_bytes(), v.length).unwrap();
        assert_eq!(hex::encode(out.expose_secret()), v.output, "{}", v.name);
    }
}

fn vector<'a>(file: &'a File, name: &str) -> &'a Vector {
    file.vectors.iter().find(|v| v.name == name).unwrap()
}

#[test]
fn disk_key_vectors_are_reproduced_through_the_cluster_kms() {
    let file = load();
    for name in ["HKDFZero", "HKDF0xFF"] {
        let v = vector(&file, name);
        let kms = cluster_kms(&v.secret, &v.salt);
        let uuid = v.info.as_deref().unwrap();
        for spelling in [uuid.to_owned(), uuid.to_ascii_uppercase()] {
            let id = KeyId::disk(&spelling).unwrap();
            let key = kms.data_key(&id, v.length).unwrap();
            assert_eq!(
                hex::encode(key.expose_secret()),
                v.output,
                "{name} {spelling}"
            );
            // The key service's ID parser reaches the same key.
            let parsed = KeyId::parse(&spelling).unwrap();
            assert_eq!(kms.data_key(&parsed, v.length).unwrap(), key);
        }
    }
}

#[test]
fn measurement_secret_vector_is_reproduced_through_the_cluster_kms() {
    let file = load();
    let v = vector(&file, "HKDFMeasurementSecret");
    let kms = cluster_kms(&v.secret, &v.salt);
    let key = kms.data_key(&KeyId::MeasurementSecret, v.length).unwrap();
    assert_eq!(hex::encode(key.expose_secret()), v.output);
}

#[test]
fn cluster_id_vector_is_reproduced_by_derive_cluster_id() {
    let file = load();
    let v = vector(&file, "HKDFClusterID");
    let secret = DataKey::new(h(&v.secret)).unwrap();
    let salt: [u8; MEASUREMENT_SALT_LEN] = h(&v.salt).try_into().unwrap();
    let id = derive_cluster_id(&secret, &salt).unwrap();
    assert_eq!(id.to_hex(), v.output);
    assert_eq!(id.to_string(), v.output);
}

#[test]
fn end_to_end_values_are_reproduced() {
    let e = load().end_to_end;
    let kms = cluster_kms(&e.master_secret, &e.salt);

    let measurement_secret = kms.data_key(&KeyId::MeasurementSecret, 32).unwrap();
    assert_eq!(
        hex::encode(measurement_secret.expose_secret()),
        e.measurement_secret
    );

    let salt: [u8; MEASUREMENT_SALT_LEN] = h(&e.measurement_salt).try_into().unwrap();
    let cluster_id = derive_cluster_id(&measurement_secret, &salt).unwrap();
    assert_eq!(cluster_id.to_hex(), e.cluster_id);

    let seed = kms.data_key(&KeyId::EmergencySshCa, 32).unwrap();
    assert_eq!(hex::encode(seed.expose_secret()), e.ssh_ca_seed);

    // The same through the key service's ID parser.
    for (id, want) in [
        ("measurementSecret", &e.measurement_secret),
        ("ca_emergency_ssh", &e.ssh_ca_seed),
    ] {
        let key = kms.data_key(&KeyId::parse(id).unwrap(), 32).unwrap();
        assert_eq!(&hex::encode(key.expose_secret()), want, "{id}");
    }
}
