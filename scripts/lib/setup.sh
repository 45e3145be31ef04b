# Shared setup for the scripts in scripts/: installs what Asterism needs on a fresh Debian
# machine when it is missing. Sourced, not executed.

# Debian packages: the TPM emulator and tools (tests and local clusters), the TSS2
# libraries the `asterism-tpm` crate links, cryptsetup for LUKS2 state disks (the program,
# and the library the `asterism-cryptsetup` crate links).
SYSTEM_PACKAGES=(swtpm swtpm-tools tpm2-tools libtss2-dev cryptsetup-bin libcryptsetup-dev pkg-config)

step() { printf '\n==> %s\n' "$*" >&2; }

install_system_packages() {
    local missing=()
    for pkg in "${SYSTEM_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' \
            || missing+=("$pkg")
    done
    if ((${#missing[@]} == 0)); then
        return
    fi
    step "installing Debian packages: ${missing[*]}"
    local sudo=()
    if [ "$(id -u)" -ne 0 ]; then sudo=(sudo); fi
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

install_rust_components() {
    if ! command -v cargo >/dev/null 2>&1; then
        echo "cargo not found: install Rust with rustup (https://rustup.rs) first" >&2
        exit 1
    fi
    # rust-toolchain.toml pins the toolchain; make sure its components are present.
    if command -v rustup >/dev/null 2>&1; then
        rustup component add rustfmt clippy >/dev/null
    fi
}

# Installs a cargo subcommand (`cargo-fuzz`, `cargo-deny`, `cargo-mutants`) from crates.io
# when it is missing, at the version given (the one the scripts were written against).
install_cargo_tool() {
    local name=$1 version=$2
    if command -v "$name" >/dev/null 2>&1; then
        return
    fi
    step "installing $name $version (cargo install --locked)"
    cargo install --locked "$name@$version"
}

# Installs QEMU and OVMF for VM mode when they are missing; true when both are usable. A
# machine whose package sources lack them gets false, not a failure: callers say SKIPPED.
vm_host_ready() {
    local pkg missing=()
    for pkg in qemu-system-x86 ovmf; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' \
            || missing+=("$pkg")
    done
    if ((${#missing[@]})); then
        step "installing Debian packages: ${missing[*]}"
        local sudo=()
        if [ "$(id -u)" -ne 0 ]; then sudo=(sudo); fi
        "${sudo[@]}" apt-get update -qq || true
        DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" || true
    fi
    command -v qemu-system-x86_64 >/dev/null 2>&1 && [ -e /usr/share/OVMF/OVMF_CODE_4M.fd ]
}
