//! The native core's one tokio runtime, shared by bookies and ledger clients in this process.

use std::sync::OnceLock;

use tokio::runtime::Runtime;

static RUNTIME: OnceLock<Runtime> = OnceLock::new();

pub fn runtime() -> &'static Runtime {
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("magnetar-core")
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("cannot start the native runtime: {e}"))
    })
}
