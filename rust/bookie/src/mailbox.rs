//! A queue with one sending handle and one receiving thread that parks at once when it is
//! empty.
//!
//! The journal's thread sleeps between group commits, often for longer than a commit
//! takes. A general-purpose channel spins and then yields the processor several times
//! before it parks its receiver, hoping a message arrives meanwhile; each yield is a system
//! call, and on a busy machine a switch to another thread and back. The journal gains
//! nothing from that: its senders are on other threads and a wake-up costs one futex call.
//! So this queue takes its lock, looks, and waits on a condition variable, and a send
//! signals only when the receiver is waiting.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

pub use crossbeam_channel::{RecvTimeoutError, SendError, TryRecvError};

struct State<T> {
    queue: VecDeque<T>,
    /// The receiver is parked (or about to park) waiting for a message.
    waiting: bool,
    sender_alive: bool,
    receiver_alive: bool,
}

struct Shared<T> {
    state: Mutex<State<T>>,
    ready: Condvar,
}

/// The sending half; dropping it disconnects the receiver once the queue is drained.
pub struct Sender<T>(Arc<Shared<T>>);

/// The receiving half.
pub struct Receiver<T>(Arc<Shared<T>>);

/// A new, empty mailbox.
pub fn mailbox<T>() -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            queue: VecDeque::new(),
            waiting: false,
            sender_alive: true,
            receiver_alive: true,
        }),
        ready: Condvar::new(),
    });
    (Sender(shared.clone()), Receiver(shared))
}

impl<T> Sender<T> {
    /// Queue `msg`; it comes back in the error when the receiver is gone.
    pub fn send(&self, msg: T) -> Result<(), SendError<T>> {
        let mut state = self.0.state.lock();
        if !state.receiver_alive {
            return Err(SendError(msg));
        }
        state.queue.push_back(msg);
        let wake = state.waiting;
        drop(state);
        if wake {
            self.0.ready.notify_one();
        }
        Ok(())
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        self.0.state.lock().sender_alive = false;
        self.0.ready.notify_one();
    }
}

impl<T> Receiver<T> {
    /// Whether nothing is queued now.
    pub fn is_empty(&self) -> bool {
        self.0.state.lock().queue.is_empty()
    }

    /// The next message if one is queued.
    pub fn try_recv(&self) -> Result<T, TryRecvError> {
        let mut state = self.0.state.lock();
        match state.queue.pop_front() {
            Some(msg) => Ok(msg),
            None if state.sender_alive => Err(TryRecvError::Empty),
            None => Err(TryRecvError::Disconnected),
        }
    }

    /// The next message, waiting as long as it takes; an error once the sender is gone and
    /// the queue empty.
    pub fn recv(&self) -> Result<T, crossbeam_channel::RecvError> {
        self.wait(None).map_err(|_| crossbeam_channel::RecvError)
    }

    /// The next message, waiting until `deadline` at the latest.
    pub fn recv_deadline(&self, deadline: Instant) -> Result<T, RecvTimeoutError> {
        self.wait(Some(deadline))
    }

    fn wait(&self, deadline: Option<Instant>) -> Result<T, RecvTimeoutError> {
        let mut state = self.0.state.lock();
        loop {
            if let Some(msg) = state.queue.pop_front() {
                return Ok(msg);
            }
            if !state.sender_alive {
                return Err(RecvTimeoutError::Disconnected);
            }
            state.waiting = true;
            let timed_out = match deadline {
                Some(d) => self.0.ready.wait_until(&mut state, d).timed_out(),
                None => {
                    self.0.ready.wait(&mut state);
                    false
                }
            };
            state.waiting = false;
            if timed_out && state.queue.is_empty() {
                return Err(RecvTimeoutError::Timeout);
            }
        }
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let mut state = self.0.state.lock();
        state.receiver_alive = false;
        // What was queued and never received is dropped here, with its completions.
        let queued = std::mem::take(&mut state.queue);
        drop(state);
        drop(queued);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn messages_arrive_in_order_across_threads() {
        let (tx, rx) = mailbox();
        let t = std::thread::spawn(move || {
            for i in 0..10_000u32 {
                tx.send(i).unwrap();
            }
        });
        for i in 0..10_000u32 {
            assert_eq!(rx.recv().unwrap(), i);
        }
        t.join().unwrap();
        assert!(rx.recv().is_err(), "the sender is gone and the queue drained");
    }

    #[test]
    fn a_deadline_ends_the_wait_and_a_late_message_still_arrives() {
        let (tx, rx) = mailbox::<u8>();
        let start = Instant::now();
        let deadline = start + Duration::from_millis(20);
        assert!(matches!(rx.recv_deadline(deadline), Err(RecvTimeoutError::Timeout)));
        assert!(Instant::now() >= deadline);
        tx.send(7).unwrap();
        assert_eq!(rx.try_recv(), Ok(7));
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
        drop(tx);
        assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
    }

    /// Wait (bounded) until the receiver is parked on the condition variable.
    fn until_parked<T>(tx: &Sender<T>) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !tx.0.state.lock().waiting {
            assert!(Instant::now() < deadline, "the receiver never parked");
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_parked_receiver_wakes_for_a_send_and_for_the_sender_going() {
        let (tx, rx) = mailbox::<u8>();
        let (got_tx, got_rx) = crossbeam_channel::unbounded();
        let t = std::thread::spawn(move || {
            got_tx.send(rx.recv().ok()).unwrap();
            got_tx.send(rx.recv().ok()).unwrap();
        });
        until_parked(&tx);
        tx.send(1).unwrap();
        assert_eq!(got_rx.recv_timeout(Duration::from_secs(10)), Ok(Some(1)));
        until_parked(&tx);
        drop(tx);
        assert_eq!(got_rx.recv_timeout(Duration::from_secs(10)), Ok(None));
        t.join().unwrap();
    }

    #[test]
    fn sending_to_a_dropped_receiver_gives_the_message_back() {
        let (tx, rx) = mailbox::<String>();
        drop(rx);
        let SendError(back) = tx.send("x".into()).unwrap_err();
        assert_eq!(back, "x");
    }
}
