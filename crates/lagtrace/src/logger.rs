//! The printer for the engines' `log` records: the engines never print, they log (the lab's
//! server errors, the lab guard's teardown failure); this writes each record to stderr as
//! `TARGET: message`, the exact lines the engines printed themselves before.

/// Writes `log` records at `Warn` and above to stderr.
struct StderrLog;

impl log::Log for StderrLog {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::Level::Warn
    }

    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            eprintln!("{}: {}", record.target(), record.args());
        }
    }

    fn flush(&self) {}
}

/// Installs the stderr printer once; a second call is a no-op.
pub fn install() {
    static LOGGER: StderrLog = StderrLog;
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(log::LevelFilter::Warn);
    }
}
