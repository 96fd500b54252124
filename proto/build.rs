//! Compiles the .proto files with protox (pure Rust, no system protoc) and
//! generates prost messages, tonic services and pbjson serde impls.

use std::path::PathBuf;

use anyhow::Context;
use prost::Message;

const PROTOS: &[&str] = &[
    "localnet/v1/localnet.proto",
    "podinfo/v1alpha1/podinfo.proto",
];

fn main() -> anyhow::Result<()> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    for p in PROTOS {
        println!("cargo:rerun-if-changed={}", root.join(p).display());
    }

    let fds = protox::compile(PROTOS, [&root]).context("compiling protos")?;
    let descriptor_path = out.join("descriptors.bin");
    std::fs::write(&descriptor_path, fds.encode_to_vec())?;

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .file_descriptor_set_path(&descriptor_path)
        .compile_well_known_types(true)
        .extern_path(".google.protobuf", "::pbjson_types")
        .compile_fds(fds)
        .context("generating tonic code")?;

    let descriptors = std::fs::read(&descriptor_path)?;
    pbjson_build::Builder::new()
        .register_descriptors(&descriptors)?
        .preserve_proto_field_names()
        .build(&[".localnet.v1", ".podinfo.v1alpha1"])
        .context("generating pbjson serde impls")?;
    Ok(())
}
