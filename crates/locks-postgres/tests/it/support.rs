//! Shared set-up: a pool on the test server; the rest comes from `throwaway_pg::testing`.

use locks_postgres::deadpool_postgres::Pool;
use locks_postgres::tokio_postgres;
pub(crate) use throwaway_pg::testing::{admin, database_url};

/// A pool of `size` connections on the test server.
pub(crate) fn pool(size: usize) -> Pool {
    locks_postgres::plain_pool(&database_url(), size).expect("pool")
}

/// An admin connection to the test server, with the fencing tokens' table installed.
pub(crate) async fn admin_with_fencing() -> tokio_postgres::Client {
    let admin = admin().await;
    locks_postgres::install_fencing(&admin)
        .await
        .expect("install the fencing tokens' table");
    admin
}

/// A pool of `size` connections on the test server built by hand with deadpool's own
/// connector, not [`locks_postgres::LockConnect`]: the end of a connection wakes no
/// monitor, so only the periodic check (or a release) finds it. For tests of what a
/// release finds before the monitor looks.
pub(crate) fn unannounced_pool(size: usize) -> Pool {
    use locks_postgres::deadpool_postgres::{Manager, ManagerConfig, RecyclingMethod, Runtime};
    let config: tokio_postgres::Config = database_url().parse().expect("URL");
    let manager = Manager::from_config(
        config,
        tokio_postgres::NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(size)
        .runtime(Runtime::Tokio1)
        .build()
        .expect("pool")
}

/// The server's `server_version_num` (`130023` for 13.23): tests of features that differ
/// by version branch on it and assert each side.
pub(crate) async fn server_version_num(admin: &tokio_postgres::Client) -> i32 {
    let text: String = admin
        .query_one("SHOW server_version_num", &[])
        .await
        .expect("SHOW server_version_num")
        .get(0);
    text.parse().expect("server_version_num is a number")
}

/// How many sessions hold (granted) the advisory lock `lock_id`.
pub(crate) async fn holders(admin: &tokio_postgres::Client, lock_id: i64) -> i64 {
    throwaway_pg::testing::advisory_count(admin, lock_id, true).await
}

/// A key no other test uses.
pub(crate) fn unique_key(name: &str) -> String {
    format!("it:{}", throwaway_pg::testing::unique(name))
}

/// Counts the events whose message starts with `prefix`, from any thread.
pub(crate) struct Counting {
    pub(crate) prefix: &'static str,
    pub(crate) seen: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Counting {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message<'a>(&'static str, &'a mut bool);
        impl tracing::field::Visit for Message<'_> {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    *self.1 |= format!("{value:?}").starts_with(self.0);
                }
            }
        }
        let mut matched = false;
        event.record(&mut Message(self.prefix, &mut matched));
        if matched {
            self.seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
}
