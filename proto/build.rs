// Generates the gRPC client from the one contract both sides share; protoc comes vendored so a
// fresh machine needs no system protobuf compiler.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; prost-build reads PROTOC from the environment.
    unsafe { std::env::set_var("PROTOC", protoc) };
    tonic_prost_build::configure()
        .build_server(false)
        .compile_protos(&["decision.proto"], &["."])?;
    println!("cargo:rerun-if-changed=decision.proto");
    Ok(())
}
