//! Completions: how results cross from the native runtime back into trio.
//!
//! Native operations run on the core's tokio runtime and never block the caller. Each one
//! is started with a `CompletionQueue` and a token; when it finishes, its result is pushed
//! onto that queue. The queue owns one end of a socket pair whose other end trio waits on
//! (`trio.lowlevel.wait_readable`). A byte is written only when the queue goes from empty
//! to non-empty, so a burst of completions wakes trio once, and trio drains the whole batch
//! in one `drain()` call.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

/// A finished operation's result, converted to Python objects only when drained.
pub type Outcome = Box<dyn FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send>;

struct Shared {
    items: Mutex<Vec<(u64, Outcome)>>,
    waker: UnixStream,
}

/// The sending side handed to native tasks.
#[derive(Clone)]
pub struct Completer {
    shared: Arc<Shared>,
}

impl Completer {
    pub fn complete(&self, token: u64, outcome: Outcome) {
        let was_empty = {
            let mut items = self.shared.items.lock();
            let was_empty = items.is_empty();
            items.push((token, outcome));
            was_empty
        };
        if was_empty {
            // A full socket buffer means trio already has a wake-up pending.
            let _ = (&self.shared.waker).write(&[1u8]);
        }
    }
}

#[pyclass(module = "core._native")]
pub struct CompletionQueue {
    shared: Arc<Shared>,
    reader: UnixStream,
}

#[pymethods]
impl CompletionQueue {
    #[new]
    fn new() -> PyResult<Self> {
        let (reader, waker) = UnixStream::pair()?;
        reader.set_nonblocking(true)?;
        waker.set_nonblocking(true)?;
        Ok(Self { shared: Arc::new(Shared { items: Mutex::new(Vec::new()), waker }), reader })
    }

    /// The file descriptor that becomes readable when completions are waiting.
    fn fileno(&self) -> i32 {
        self.reader.as_raw_fd()
    }

    /// Every waiting completion as `(token, ok, value)`; `value` is the result when `ok`,
    /// else the exception instance.
    fn drain<'py>(&mut self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        // Empty the wake-up socket: a read that does not fill the buffer took all there was
        // (one byte per empty-to-non-empty change), which spares a read that would only
        // answer "would block".
        let mut buf = [0u8; 256];
        while let Ok(n) = self.reader.read(&mut buf) {
            if n < buf.len() {
                break;
            }
        }
        let items = std::mem::take(&mut *self.shared.items.lock());
        let mut out = Vec::with_capacity(items.len());
        for (token, outcome) in items {
            let tuple = match outcome(py) {
                Ok(value) => (token, true, value).into_pyobject(py)?,
                Err(err) => (token, false, err.into_value(py)).into_pyobject(py)?,
            };
            out.push(tuple);
        }
        Ok(out)
    }
}

impl CompletionQueue {
    pub fn completer(&self) -> Completer {
        Completer { shared: self.shared.clone() }
    }
}
