fn main() -> std::process::ExitCode {
    ztensor_mount::cli::main()
}
