//! Builds the one C file of the preload: thread-local storage with the initial-exec model,
//! which stable Rust cannot request. Hooks run inside `malloc`, where a general-dynamic TLS
//! access (`__tls_get_addr`) may itself allocate on a thread's first access.
fn main() {
    println!("cargo:rerun-if-changed=csrc/thread_slots.c");
    cc::Build::new()
        .file("csrc/thread_slots.c")
        .flag_if_supported("-ftls-model=initial-exec")
        .opt_level(2)
        .compile("memwarden_thread_slots");
}
