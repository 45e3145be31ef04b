//! Links libcryptsetup, found through pkg-config. Version 2.4 is the oldest with
//! `crypt_dump_json`, which the state disk needs to validate the header it loaded.

fn main() {
    if let Err(error) = pkg_config::Config::new()
        .atleast_version("2.4")
        .probe("libcryptsetup")
    {
        // A build script reports through its exit status; there is no caller to return to.
        eprintln!(
            "asterism-cryptsetup needs libcryptsetup >= 2.4 and its development files \
             (Debian: apt-get install libcryptsetup-dev pkg-config): {error}"
        );
        std::process::exit(1);
    }
}
