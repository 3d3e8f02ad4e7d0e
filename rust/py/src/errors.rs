//! Native errors as Python exceptions (all subclasses of `core._native.NativeError`).

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(_native, NativeError, PyException, "An error from Magnetar's native core.");
create_exception!(_native, NotEnoughBookiesError, NativeError, "Not enough non-faulty bookies available.");
create_exception!(_native, FencedError, NativeError, "The ledger was fenced by another writer.");
create_exception!(_native, LedgerClosedError, NativeError, "The ledger or managed ledger is closed.");
create_exception!(_native, NoSuchLedgerError, NativeError, "No such ledger.");
create_exception!(_native, MetadataError, NativeError, "The metadata store failed.");
create_exception!(_native, BookieError, NativeError, "A bookie failed.");
create_exception!(_native, CursorNotFoundError, NativeError, "No such cursor.");

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("NativeError", py.get_type::<NativeError>())?;
    m.add("NotEnoughBookiesError", py.get_type::<NotEnoughBookiesError>())?;
    m.add("FencedError", py.get_type::<FencedError>())?;
    m.add("LedgerClosedError", py.get_type::<LedgerClosedError>())?;
    m.add("NoSuchLedgerError", py.get_type::<NoSuchLedgerError>())?;
    m.add("MetadataError", py.get_type::<MetadataError>())?;
    m.add("BookieError", py.get_type::<BookieError>())?;
    m.add("CursorNotFoundError", py.get_type::<CursorNotFoundError>())?;
    Ok(())
}
