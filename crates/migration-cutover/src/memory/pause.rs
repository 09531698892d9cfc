//! The in-memory write pause: a per-tenant gate with a count of writes in flight.

use std::collections::HashMap;
use std::future::{Future, poll_fn, ready};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};
use std::time::Duration;

use uuid::Uuid;

use super::lock;
use crate::ports::{PauseGuard, RepositoryError, WritePause, WritesPaused};
use crate::timer::timeout;

/// A write pause for the tenants of one process.
///
/// Pausing is immediate and cannot fail; waiting writers are woken the moment the
/// last pause of their tenant ends. Other processes do not see this pause: they see
/// the routing state `cutover_paused`, which the cutover sets right after pausing and
/// which [`WriteRouter`](crate::WriteRouter) also waits on.
///
/// ```
/// use std::time::Duration;
/// use migration_cutover::{InMemoryWritePause, PauseGuard, WritePause};
/// use uuid::Uuid;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let pause = InMemoryWritePause::new();
/// let tenant = Uuid::new_v4();
/// let guard = pause.pause(tenant).await.unwrap();
/// assert!(pause.admit(tenant, Duration::from_millis(10)).await.is_err());
/// guard.resume().await;
/// assert!(pause.admit(tenant, Duration::ZERO).await.is_ok());
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct InMemoryWritePause {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    gates: HashMap<Uuid, Gate>,
    waiters: HashMap<u64, Waker>,
    next_waiter: u64,
}

#[derive(Debug, Default, Clone, Copy)]
struct Gate {
    pauses: usize,
    in_flight: usize,
}

impl State {
    fn gate(&mut self, tenant_id: Uuid) -> &mut Gate {
        self.gates.entry(tenant_id).or_default()
    }

    /// Forgets idle gates and wakes every waiter to look again.
    fn changed(&mut self, tenant_id: Uuid) {
        let idle = self
            .gates
            .get(&tenant_id)
            .is_some_and(|gate| gate.pauses == 0 && gate.in_flight == 0);
        if idle {
            self.gates.remove(&tenant_id);
        }
        for (_, waker) in self.waiters.drain() {
            waker.wake();
        }
    }
}

impl Shared {
    /// Waits until `step` returns `Some`, running it under the state lock each time
    /// the state changes.
    async fn wait_until<T>(&self, mut step: impl FnMut(&mut State) -> Option<T>) -> T {
        let mut registration = Registration {
            shared: self,
            id: None,
        };
        poll_fn(|cx| {
            let mut state = lock(&self.state);
            if let Some(output) = step(&mut state) {
                return Poll::Ready(output);
            }
            let id = *registration.id.get_or_insert_with(|| {
                state.next_waiter = state.next_waiter.wrapping_add(1);
                state.next_waiter
            });
            state.waiters.insert(id, cx.waker().clone());
            Poll::Pending
        })
        .await
    }
}

/// Removes a waiter's waker when its wait ends or is dropped.
struct Registration<'a> {
    shared: &'a Shared,
    id: Option<u64>,
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            lock(&self.shared.state).waiters.remove(&id);
        }
    }
}

impl InMemoryWritePause {
    /// No tenant paused.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// How many admitted writes of the tenant are still running.
    #[must_use]
    pub fn in_flight(&self, tenant_id: Uuid) -> usize {
        lock(&self.shared.state)
            .gates
            .get(&tenant_id)
            .map_or(0, |gate| gate.in_flight)
    }
}

impl WritePause for InMemoryWritePause {
    type Permit = InMemoryWritePermit;
    type Guard = InMemoryPauseGuard;

    fn pause(
        &self,
        tenant_id: Uuid,
    ) -> impl Future<Output = Result<Self::Guard, RepositoryError>> + Send {
        lock(&self.shared.state).gate(tenant_id).pauses += 1;
        ready(Ok(InMemoryPauseGuard {
            shared: self.shared.clone(),
            tenant_id,
        }))
    }

    fn admit(
        &self,
        tenant_id: Uuid,
        limit: Duration,
    ) -> impl Future<Output = Result<Self::Permit, WritesPaused>> + Send {
        let shared = self.shared.clone();
        async move {
            let admitted = timeout(
                limit,
                shared.wait_until(|state| {
                    let gate = state.gate(tenant_id);
                    if gate.pauses > 0 {
                        return None;
                    }
                    gate.in_flight += 1;
                    Some(())
                }),
            )
            .await;
            match admitted {
                Ok(()) => Ok(InMemoryWritePermit { shared, tenant_id }),
                Err(_) => Err(WritesPaused {
                    tenant_id,
                    waited: limit,
                }),
            }
        }
    }

    fn is_paused(&self, tenant_id: Uuid) -> bool {
        lock(&self.shared.state)
            .gates
            .get(&tenant_id)
            .is_some_and(|gate| gate.pauses > 0)
    }
}

/// One admitted write of [`InMemoryWritePause`]; dropping it ends the write.
#[derive(Debug)]
#[must_use = "the write counts as running only while the permit is held"]
pub struct InMemoryWritePermit {
    shared: Arc<Shared>,
    tenant_id: Uuid,
}

impl Drop for InMemoryWritePermit {
    fn drop(&mut self) {
        let mut state = lock(&self.shared.state);
        let gate = state.gate(self.tenant_id);
        gate.in_flight = gate.in_flight.saturating_sub(1);
        state.changed(self.tenant_id);
    }
}

/// A pause of [`InMemoryWritePause`]; dropping it resumes writes at once.
#[derive(Debug)]
#[must_use = "dropping the guard resumes writes at once"]
pub struct InMemoryPauseGuard {
    shared: Arc<Shared>,
    tenant_id: Uuid,
}

impl Drop for InMemoryPauseGuard {
    fn drop(&mut self) {
        let mut state = lock(&self.shared.state);
        let gate = state.gate(self.tenant_id);
        gate.pauses = gate.pauses.saturating_sub(1);
        state.changed(self.tenant_id);
    }
}

impl PauseGuard for InMemoryPauseGuard {
    fn tenant_id(&self) -> Uuid {
        self.tenant_id
    }

    fn drained(&self) -> impl Future<Output = ()> + Send {
        let tenant_id = self.tenant_id;
        let shared = self.shared.clone();
        async move {
            shared
                .wait_until(|state| {
                    let idle = state.gates.get(&tenant_id).is_none_or(|g| g.in_flight == 0);
                    idle.then_some(())
                })
                .await;
        }
    }

    fn resume(self) -> impl Future<Output = ()> + Send {
        drop(self);
        ready(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[tokio::test]
    async fn a_paused_writer_is_admitted_when_the_pause_ends() {
        let pause = InMemoryWritePause::new();
        let tenant = Uuid::new_v4();
        let guard = pause.pause(tenant).await.unwrap();
        assert!(pause.is_paused(tenant));
        let writer = {
            let pause = pause.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let permit = pause.admit(tenant, Duration::from_secs(5)).await;
                (permit.is_ok(), started.elapsed())
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        guard.resume().await;
        let (admitted, waited) = writer.await.unwrap();
        assert!(admitted);
        assert!(waited >= Duration::from_millis(40), "{waited:?}");
        assert!(!pause.is_paused(tenant));
        assert!(lock(&pause.shared.state).waiters.is_empty());
    }

    #[tokio::test]
    async fn a_paused_writer_gives_up_after_its_timeout() {
        let pause = InMemoryWritePause::new();
        let tenant = Uuid::new_v4();
        let _guard = pause.pause(tenant).await.unwrap();
        let error = pause
            .admit(tenant, Duration::from_millis(30))
            .await
            .unwrap_err();
        assert_eq!(error.tenant_id, tenant);
        assert_eq!(error.waited, Duration::from_millis(30));
        assert!(error.to_string().contains("gave up after 30 ms"), "{error}");
        assert!(lock(&pause.shared.state).waiters.is_empty());
    }

    #[tokio::test]
    async fn drained_waits_for_the_writes_admitted_before_the_pause() {
        let pause = InMemoryWritePause::new();
        let tenant = Uuid::new_v4();
        let permit = pause.admit(tenant, Duration::ZERO).await.unwrap();
        assert_eq!(pause.in_flight(tenant), 1);
        let guard = pause.pause(tenant).await.unwrap();
        let drained = tokio::time::timeout(Duration::from_millis(30), guard.drained()).await;
        assert!(drained.is_err(), "a write is still running");
        drop(permit);
        tokio::time::timeout(Duration::from_secs(5), guard.drained())
            .await
            .expect("drained once the write finished");
        drop(guard);
        assert!(lock(&pause.shared.state).gates.is_empty());
    }

    #[tokio::test]
    async fn pauses_nest_and_other_tenants_are_not_paused() {
        let pause = InMemoryWritePause::new();
        let tenant = Uuid::new_v4();
        let first = pause.pause(tenant).await.unwrap();
        let second = pause.pause(tenant).await.unwrap();
        assert!(pause.admit(Uuid::new_v4(), Duration::ZERO).await.is_ok());
        drop(first);
        assert!(pause.is_paused(tenant));
        assert!(pause.admit(tenant, Duration::ZERO).await.is_err());
        drop(second);
        assert!(pause.admit(tenant, Duration::ZERO).await.is_ok());
    }
}
