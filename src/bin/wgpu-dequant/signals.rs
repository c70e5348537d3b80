//! Interruption: Ctrl-C, a kill or a closed terminal undoes the run in
//! progress ([`wgpu_dequant::interrupt`]) before the process ends, so
//! nothing half-written is left behind. Each platform has its own way of
//! being told; what is done is the same.

/// Starts listening; returns an error message when the platform refuses.
pub fn install() -> Result<(), String> {
    platform::install()
}

#[cfg(unix)]
mod platform {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    use signal_hook::iterator::Signals;

    pub fn install() -> Result<(), String> {
        let mut signals = Signals::new([SIGINT, SIGTERM, SIGHUP]).map_err(|e| e.to_string())?;
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                if let Some(signal) = signals.forever().next() {
                    wgpu_dequant::interrupt();
                    // Die of the signal itself, as an uncaught one would: the
                    // parent sees it, and shells report 128 + its number.
                    let _ = signal_hook::low_level::emulate_default_handler(signal);
                    std::process::exit(128 + signal);
                }
            })
            .map(drop)
            .map_err(|e| e.to_string())
    }
}

#[cfg(windows)]
mod platform {
    /// What a console process ended by Ctrl-C exits with (STATUS_CONTROL_C_EXIT).
    const CONTROL_C_EXIT: i32 = 0xC000_013A_u32 as i32;

    pub fn install() -> Result<(), String> {
        // Ctrl-C, Ctrl-Break and the console window closing.
        ctrlc::set_handler(|| {
            wgpu_dequant::interrupt();
            std::process::exit(CONTROL_C_EXIT);
        })
        .map_err(|e| e.to_string())
    }
}

#[cfg(not(any(unix, windows)))]
mod platform {
    /// No signals to listen to here (e.g. WASI): a killed run is cleaned up
    /// by the next one, which finds its staging folder unlocked.
    pub fn install() -> Result<(), String> {
        Ok(())
    }
}
