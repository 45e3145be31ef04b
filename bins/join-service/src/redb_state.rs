//! [`ClusterState`] in an embedded redb database: the default store, which keeps the
//! membership state in a file so it survives restarts (`kube_state.rs` is the other).

use crate::state::{
    Admission, Cause, ClusterState, Member, StateError, TOKEN_MIN_REMAINING, TOKEN_TTL,
    init_node_ak, is_ak,
};
use asterism_attestation::AkFingerprint;
use asterism_cluster::{BootstrapToken, ExpiringToken, InitNode, Role};
use asterism_kms::DiskUuid;
use redb::{
    Database, ReadableDatabase as _, ReadableTable, ReadableTableMetadata as _, TableDefinition,
};
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, oneshot};
use zeroize::Zeroizing;

/// The most the store's page cache holds in memory (redb's default allows 1 GiB).
const STORE_CACHE_BYTES: usize = 4 << 20;
const MEMBERS: TableDefinition<&str, &[u8]> = TableDefinition::new("members");
const DISKS: TableDefinition<&str, &[u8]> = TableDefinition::new("disk_bindings");
const TOKENS: TableDefinition<&str, &[u8]> = TableDefinition::new("bootstrap_tokens");
/// The disk each attestation key is bound to (the index of `disk_bindings` by key).
const AK_DISKS: TableDefinition<&str, &str> = TableDefinition::new("disks_by_ak");
/// Each member's attestation key (hex) to its name: one key is one node.
const AK_MEMBERS: TableDefinition<&str, &str> = TableDefinition::new("members_by_ak");

/// A failure of the embedded database (or of encoding what it holds).
fn store(e: impl Into<Cause>) -> StateError {
    StateError::store_caused("the embedded database", e)
}

/// A new random bootstrap token.
fn generate_token() -> Result<BootstrapToken, StateError> {
    let rng = SystemRandom::new();
    BootstrapToken::generate(|buf| {
        rng.fill(buf)
            .map_err(|_| StateError::store_failed("no randomness"))
    })
}

#[derive(Serialize, Deserialize)]
struct DiskRecord {
    ak: String,
    bound_at: u64,
}

#[derive(Serialize, Deserialize)]
struct TokenRecord {
    token: String,
    expires: u64,
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Most writes committed in one transaction.
const MAX_WRITES_PER_COMMIT: usize = 512;

/// [`ClusterState`] in an embedded redb database (`<state dir>/cluster-state.redb`, mode
/// 0600 in a 0700 directory: it holds bootstrap tokens).
///
/// Writes go through one writer thread that commits every write queued while it was busy
/// in one transaction (group commit): one fsync covers a burst of tickets, and each caller
/// is answered only after the commit that holds its write has returned, so nothing a
/// caller was told is lost on a crash. A write that is refused (a disk bound to another
/// key) writes nothing and does not affect the others in its transaction; a write that
/// fails otherwise aborts the transaction, and every write in it fails.
#[derive(Clone)]
pub struct RedbState {
    db: Arc<Database>,
    writer: Arc<Writer>,
    path: PathBuf,
}

impl std::fmt::Debug for RedbState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbState")
            .field("path", &self.path)
            .finish()
    }
}

/// The open tables of a write transaction.
struct Tables<'txn> {
    disks: redb::Table<'txn, &'static str, &'static [u8]>,
    ak_disks: redb::Table<'txn, &'static str, &'static str>,
    ak_members: redb::Table<'txn, &'static str, &'static str>,
    members: redb::Table<'txn, &'static str, &'static [u8]>,
    tokens: redb::Table<'txn, &'static str, &'static [u8]>,
}

/// A write waiting for the writer thread.
trait PendingWrite: Send {
    /// Applies the write in the open transaction. An error aborts the transaction; a
    /// refusal is the write's outcome instead and must leave the tables untouched.
    fn apply(&mut self, tables: &mut Tables<'_>) -> Result<(), StateError>;

    /// Answers the caller: with the outcome if the transaction committed, otherwise with
    /// `failure`.
    fn answer(self: Box<Self>, failure: Option<&Arc<StateError>>);
}

type WriteFn<T> = Box<dyn for<'a> FnOnce(&mut Tables<'a>) -> Result<T, StateError> + Send>;

struct Pending<T> {
    run: Option<WriteFn<T>>,
    outcome: Option<Result<T, StateError>>,
    reply: oneshot::Sender<Result<T, StateError>>,
}

impl<T: Send> PendingWrite for Pending<T> {
    fn apply(&mut self, tables: &mut Tables<'_>) -> Result<(), StateError> {
        let Some(run) = self.run.take() else {
            return Ok(());
        };
        match run(tables) {
            Err(
                e @ (StateError::DiskBoundToOtherKey { .. }
                | StateError::SecondDisk { .. }
                | StateError::MemberKeyChanged { .. }
                | StateError::MemberRoleChanged { .. }
                | StateError::KeyIsAnotherMember { .. }
                | StateError::NoSuchMember { .. }),
            ) => self.outcome = Some(Err(e)),
            Err(e) => return Err(e),
            Ok(v) => self.outcome = Some(Ok(v)),
        }
        Ok(())
    }

    fn answer(self: Box<Self>, failure: Option<&Arc<StateError>>) {
        let result = match (failure, self.outcome) {
            (None, Some(outcome)) => outcome,
            (Some(failure), _) => Err(StateError::store_caused(
                "the transaction holding this write",
                Arc::clone(failure),
            )),
            (None, None) => Err(StateError::store_failed("the write was not applied")),
        };
        // The caller may have given up (its request was cancelled); the write stands.
        let _ = self.reply.send(result);
    }
}

/// The writer thread and its queue; dropping the last handle lets the thread finish what
/// is queued and waits for it, so the database is closed when the state is dropped.
struct Writer {
    queue: Option<mpsc::Sender<Box<dyn PendingWrite>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Writer {
    fn drop(&mut self) {
        drop(self.queue.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn write_loop(db: &Database, mut queue: mpsc::Receiver<Box<dyn PendingWrite>>) {
    while let Some(first) = queue.blocking_recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_WRITES_PER_COMMIT {
            match queue.try_recv() {
                Ok(w) => batch.push(w),
                Err(_) => break,
            }
        }
        let failure = commit(db, &mut batch).err().map(Arc::new);
        if let Some(f) = &failure {
            tracing::error!(writes = batch.len(), error = %asterism_binkit::error_chain(f.as_ref()), "cluster state: a transaction failed; none of its writes was committed");
        }
        for w in batch {
            w.answer(failure.as_ref());
        }
    }
}

fn commit(db: &Database, batch: &mut [Box<dyn PendingWrite>]) -> Result<(), StateError> {
    let txn = db.begin_write().map_err(store)?;
    {
        let mut tables = Tables {
            disks: txn.open_table(DISKS).map_err(store)?,
            ak_disks: txn.open_table(AK_DISKS).map_err(store)?,
            ak_members: txn.open_table(AK_MEMBERS).map_err(store)?,
            members: txn.open_table(MEMBERS).map_err(store)?,
            tokens: txn.open_table(TOKENS).map_err(store)?,
        };
        for w in batch.iter_mut() {
            w.apply(&mut tables)?;
        }
    }
    txn.commit().map_err(store)
}

impl RedbState {
    /// The database file's name in the state directory.
    pub const FILE_NAME: &'static str = "cluster-state.redb";

    /// Opens (or creates) the store in `dir`, creating `dir` with mode 0700 if needed, and
    /// starts its writer thread.
    pub fn open(dir: &Path) -> Result<Self, StateError> {
        use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| StateError::store_caused(format!("creating {}", dir.display()), e))?;
        let path = dir.join(Self::FILE_NAME);
        // redb's default cache may grow to 1 GiB; the store is a few kilobytes per member,
        // and what the cache does not hold the kernel's page cache does.
        let db = redb::Builder::new()
            .set_cache_size(STORE_CACHE_BYTES)
            .create(&path)
            .map_err(|e| StateError::store_caused(format!("opening {}", path.display()), e))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| StateError::store_caused(format!("restricting {}", path.display()), e))?;
        let txn = db.begin_write().map_err(store)?;
        {
            txn.open_table(MEMBERS).map_err(store)?;
            txn.open_table(DISKS).map_err(store)?;
            txn.open_table(TOKENS).map_err(store)?;
            // A store written before the index existed: index its bindings once.
            let mut index = txn.open_table(AK_DISKS).map_err(store)?;
            if index.is_empty().map_err(store)? {
                let disks = txn.open_table(DISKS).map_err(store)?;
                for entry in disks.iter().map_err(store)? {
                    let (disk, record) = entry.map_err(store)?;
                    let record: DiskRecord =
                        serde_json::from_slice(record.value()).map_err(store)?;
                    index
                        .insert(record.ak.as_str(), disk.value())
                        .map_err(store)?;
                }
            }
            // The same for the members' keys.
            let mut by_ak = txn.open_table(AK_MEMBERS).map_err(store)?;
            if by_ak.is_empty().map_err(store)? {
                let members = txn.open_table(MEMBERS).map_err(store)?;
                for entry in members.iter().map_err(store)? {
                    let (_, record) = entry.map_err(store)?;
                    let member: Member = serde_json::from_slice(record.value()).map_err(store)?;
                    by_ak
                        .insert(member.ak.as_str(), member.name.as_str())
                        .map_err(store)?;
                }
            }
        }
        txn.commit().map_err(store)?;
        let db = Arc::new(db);
        let (queue, rx) = mpsc::channel(MAX_WRITES_PER_COMMIT);
        let writer_db = db.clone();
        let thread = std::thread::Builder::new()
            .name("cluster-state".into())
            .spawn(move || write_loop(&writer_db, rx))
            .map_err(|e| StateError::store_caused("starting the writer thread", e))?;
        Ok(Self {
            db,
            writer: Arc::new(Writer {
                queue: Some(queue),
                thread: Some(thread),
            }),
            path,
        })
    }

    /// Runs the point read `f` on the calling task. A point read touches a few pages that
    /// redb's cache (or the kernel's page cache) holds, and takes microseconds: less than a
    /// hand-off to a blocking thread, which wakes that thread and then this task again. It
    /// does not wait for the writer thread's commit: redb takes its locks there only around
    /// copies in memory and the `pwrite`s, and syncs the file holding none a reader needs.
    /// Reads that scan a whole table go through `blocking`.
    fn read_now<T>(
        &self,
        f: impl FnOnce(&Database) -> Result<T, StateError>,
    ) -> Result<T, StateError> {
        f(&self.db)
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Database) -> Result<T, StateError> + Send + 'static,
    ) -> Result<T, StateError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || f(&db))
            .await
            .map_err(store)?
    }

    /// Queues `run` for the writer thread and waits until the transaction that holds it has
    /// committed.
    async fn write<T: Send + 'static>(
        &self,
        run: impl for<'a> FnOnce(&mut Tables<'a>) -> Result<T, StateError> + Send + 'static,
    ) -> Result<T, StateError> {
        let stopped = || StateError::store_failed("the cluster-state writer stopped");
        let (reply, answer) = oneshot::channel();
        let pending: Box<dyn PendingWrite> = Box::new(Pending {
            run: Some(Box::new(run)),
            outcome: None,
            reply,
        });
        let queue = self.writer.queue.as_ref().ok_or_else(stopped)?;
        queue.send(pending).await.map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

/// Whether `disk` may be bound to `ak` (or already is): refuses a disk of another key,
/// and a new disk for a key that has one unless `second_disk_allowed` (an operator
/// re-admitted the node).
fn may_bind(
    disks: &impl ReadableTable<&'static str, &'static [u8]>,
    ak_disks: &impl ReadableTable<&'static str, &'static str>,
    disk: &str,
    ak: &AkFingerprint,
    second_disk_allowed: bool,
) -> Result<bool, StateError> {
    let ak_hex = ak.to_string();
    match record_in::<DiskRecord>(disks, disk)? {
        Some(record) if record.ak == ak_hex => Ok(true),
        Some(_) => Err(StateError::DiskBoundToOtherKey {
            uuid: disk.to_owned(),
        }),
        None => match ak_disks.get(ak_hex.as_str()).map_err(store)? {
            Some(bound) if bound.value() != disk && !second_disk_allowed => {
                Err(StateError::SecondDisk {
                    ak: ak_hex.clone(),
                    bound: bound.value().to_owned(),
                    requested: disk.to_owned(),
                })
            }
            _ => Ok(false),
        },
    }
}

/// [`ClusterState::check_disk`] in a read transaction, given the record of the node that
/// asks (`member`), which decides whether its key may take a second disk.
fn disk_free_in(
    read: &redb::ReadTransaction,
    disk: &DiskUuid,
    ak: &AkFingerprint,
    member: Option<&Member>,
) -> Result<(), StateError> {
    let readmitted = member.is_some_and(|m| m.readmit);
    let disks = read.open_table(DISKS).map_err(store)?;
    let ak_disks = read.open_table(AK_DISKS).map_err(store)?;
    may_bind(&disks, &ak_disks, disk.as_str(), ak, readmitted).map(|_| ())
}

/// [`ClusterState::check_member`] in a read transaction, given node `name`'s record.
fn member_free_in(
    read: &redb::ReadTransaction,
    name: &str,
    ak: &AkFingerprint,
    role: Role,
    member: Option<&Member>,
) -> Result<(), StateError> {
    match member.and_then(|m| m.refusal(ak, role)) {
        Some(refused) => Err(refused),
        None => key_free_for(&read.open_table(AK_MEMBERS).map_err(store)?, ak, name),
    }
}

/// Binds `disk` to `ak` unless it is bound; refuses (before writing anything) if another
/// key holds it, or if `ak` has another disk and `second_disk_allowed` is false.
fn bind_in(
    t: &mut Tables<'_>,
    disk: &str,
    ak: &AkFingerprint,
    now: u64,
    second_disk_allowed: bool,
) -> Result<(), StateError> {
    match may_bind(&t.disks, &t.ak_disks, disk, ak, second_disk_allowed)? {
        true => Ok(()),
        false => {
            let ak = ak.to_string();
            let record = serde_json::to_vec(&DiskRecord {
                ak: ak.clone(),
                bound_at: now,
            })
            .map_err(store)?;
            t.disks.insert(disk, record.as_slice()).map_err(store)?;
            t.ak_disks.insert(ak.as_str(), disk).map_err(store)?;
            Ok(())
        }
    }
}

/// The JSON record stored under `key`, if any.
fn record_in<T: serde::de::DeserializeOwned>(
    table: &impl ReadableTable<&'static str, &'static [u8]>,
    key: &str,
) -> Result<Option<T>, StateError> {
    table
        .get(key)
        .map_err(store)?
        .map(|v| serde_json::from_slice::<T>(v.value()))
        .transpose()
        .map_err(store)
}

fn member_in(
    table: &impl ReadableTable<&'static str, &'static [u8]>,
    name: &str,
) -> Result<Option<Member>, StateError> {
    record_in(table, name)
}

/// A member admitted at `now` that has been given `tickets` tickets (the init node none).
fn new_member(
    name: String,
    role: Role,
    ak: &AkFingerprint,
    disk: String,
    now: u64,
    tickets: u64,
) -> Member {
    Member {
        name,
        role: role.to_string(),
        ak: ak.to_string(),
        disk,
        admitted_at: now,
        last_ticket_at: now,
        tickets,
        readmit: false,
    }
}

fn put_member(table: &mut redb::Table<&str, &[u8]>, member: &Member) -> Result<(), StateError> {
    let bytes = serde_json::to_vec(member).map_err(store)?;
    table
        .insert(member.name.as_str(), bytes.as_slice())
        .map_err(store)?;
    Ok(())
}

/// Refuses `ak` for member `name` if it is a member under another name.
fn key_free_for(
    ak_members: &impl ReadableTable<&'static str, &'static str>,
    ak: &AkFingerprint,
    name: &str,
) -> Result<(), StateError> {
    let ak = ak.to_string();
    match ak_members.get(ak.as_str()).map_err(store)? {
        Some(owner) if owner.value() != name => Err(StateError::KeyIsAnotherMember {
            member: owner.value().to_owned(),
            ak,
        }),
        _ => Ok(()),
    }
}

/// Records `member` and its key in the key index; a key the member had before (replaced
/// after an operator re-admitted it) leaves the index.
fn record_member_in(
    t: &mut Tables<'_>,
    member: &Member,
    previous_ak: Option<&str>,
) -> Result<(), StateError> {
    put_member(&mut t.members, member)?;
    if let Some(old) = previous_ak.filter(|old| *old != member.ak) {
        let owned_by_this = t
            .ak_members
            .get(old)
            .map_err(store)?
            .is_some_and(|owner| owner.value() == member.name);
        if owned_by_this {
            t.ak_members.remove(old).map_err(store)?;
        }
    }
    t.ak_members
        .insert(member.ak.as_str(), member.name.as_str())
        .map_err(store)?;
    Ok(())
}

/// The admission of `a` in an open transaction: the member's key and the disk binding
/// first (a refusal writes nothing), then the member, then the token.
fn admit_in(t: &mut Tables<'_>, a: &Admission) -> Result<ExpiringToken, StateError> {
    let now = unix(a.now);
    let previous = member_in(&t.members, &a.name)?;
    if let Some(refused) = previous.as_ref().and_then(|p| p.refusal(&a.ak, a.role)) {
        return Err(refused);
    }
    key_free_for(&t.ak_members, &a.ak, &a.name)?;
    let readmitted = previous.as_ref().is_some_and(|p| p.readmit);
    bind_in(t, a.disk.as_str(), &a.ak, now, readmitted)?;

    let previous_ak = previous.as_ref().map(|p| p.ak.clone());
    let member = match previous {
        Some(p) => {
            if !is_ak(&p.ak, &a.ak) {
                tracing::warn!(node = %a.name, old_ak = %p.ak, new_ak = %a.ak, "member re-admitted by an operator: its attestation key is replaced");
            }
            Member {
                role: a.role.to_string(),
                ak: a.ak.to_string(),
                disk: a.disk.to_string(),
                last_ticket_at: now,
                tickets: p.tickets.saturating_add(1),
                readmit: false,
                ..p
            }
        }
        None => new_member(a.name.clone(), a.role, &a.ak, a.disk.to_string(), now, 1),
    };
    record_member_in(t, &member, previous_ak.as_deref())?;

    let min_expiry = now.saturating_add(TOKEN_MIN_REMAINING.as_secs());
    let mut reusable = None;
    let mut expired = Vec::new();
    for entry in t.tokens.iter().map_err(store)? {
        let (k, v) = entry.map_err(store)?;
        let record: TokenRecord = serde_json::from_slice(v.value()).map_err(store)?;
        if record.expires <= now {
            expired.push(k.value().to_owned());
        } else if record.expires >= min_expiry
            && reusable
                .as_ref()
                .is_none_or(|(_, e): &(Zeroizing<String>, u64)| record.expires > *e)
        {
            reusable = Some((Zeroizing::new(record.token), record.expires));
        }
    }
    for k in expired {
        t.tokens.remove(k.as_str()).map_err(store)?;
    }
    Ok(match reusable {
        Some((token, expires)) => ExpiringToken {
            token: BootstrapToken::new(token).map_err(store)?,
            expires: UNIX_EPOCH + Duration::from_secs(expires),
        },
        None => {
            let expires = now.saturating_add(TOKEN_TTL.as_secs());
            let token = generate_token()?;
            let record = Zeroizing::new(
                serde_json::to_vec(&TokenRecord {
                    token: token.expose_secret().to_owned(),
                    expires,
                })
                .map_err(store)?,
            );
            t.tokens
                .insert(token.id(), record.as_slice())
                .map_err(store)?;
            tracing::info!(
                token_id = token.id(),
                expires_in_secs = TOKEN_TTL.as_secs(),
                "minted a bootstrap token"
            );
            ExpiringToken {
                token,
                expires: UNIX_EPOCH + Duration::from_secs(expires),
            }
        }
    })
}

impl ClusterState for RedbState {
    async fn check_disk(
        &self,
        disk: &DiskUuid,
        ak: &AkFingerprint,
        name: &str,
    ) -> Result<(), StateError> {
        self.read_now(|db| {
            let read = db.begin_read().map_err(store)?;
            let member = member_in(&read.open_table(MEMBERS).map_err(store)?, name)?;
            disk_free_in(&read, disk, ak, member.as_ref())
        })
    }

    async fn check_rejoin(&self, disk: &DiskUuid, ak: &AkFingerprint) -> Result<(), StateError> {
        let disk = disk.as_str();
        self.read_now(|db| {
            let read = db.begin_read().map_err(store)?;
            let table = read.open_table(DISKS).map_err(store)?;
            match record_in::<DiskRecord>(&table, disk)? {
                None => Err(StateError::DiskUnbound {
                    uuid: disk.to_owned(),
                }),
                Some(r) if !is_ak(&r.ak, ak) => Err(StateError::DiskBoundToOtherKey {
                    uuid: disk.to_owned(),
                }),
                Some(_) => Ok(()),
            }
        })
    }

    async fn check_member(
        &self,
        name: &str,
        ak: &AkFingerprint,
        role: Role,
    ) -> Result<(), StateError> {
        self.read_now(|db| {
            let read = db.begin_read().map_err(store)?;
            let member = member_in(&read.open_table(MEMBERS).map_err(store)?, name)?;
            member_free_in(&read, name, ak, role, member.as_ref())
        })
    }

    /// Both checks in one read transaction, reading the member once.
    async fn check_admission(&self, a: &Admission) -> Result<(), StateError> {
        self.read_now(|db| {
            let read = db.begin_read().map_err(store)?;
            let member = member_in(&read.open_table(MEMBERS).map_err(store)?, &a.name)?;
            disk_free_in(&read, &a.disk, &a.ak, member.as_ref())?;
            member_free_in(&read, &a.name, &a.ak, a.role, member.as_ref())
        })
    }

    async fn record_init_node(&self, init: &InitNode, now: SystemTime) -> Result<(), StateError> {
        let init = init.clone();
        let disk = DiskUuid::parse(&init.disk)
            .map_err(|e| StateError::store_caused("the init node's disk UUID", e))?;
        let ak = init_node_ak(&init)?;
        self.write(move |t| {
            let now = unix(now);
            let previous = member_in(&t.members, &init.name)?;
            if previous.as_ref().is_some_and(|p| !is_ak(&p.ak, &ak)) {
                return Err(StateError::MemberKeyChanged { name: init.name });
            }
            key_free_for(&t.ak_members, &ak, &init.name)?;
            bind_in(t, disk.as_str(), &ak, now, false)?;
            if previous.is_none() {
                let member =
                    new_member(init.name.clone(), init.role, &ak, init.disk.clone(), now, 0);
                record_member_in(t, &member, None)?;
            }
            Ok(())
        })
        .await
    }

    async fn allow_readmission(&self, name: &str) -> Result<Member, StateError> {
        let name = name.to_owned();
        self.write(move |t| {
            let Some(mut member) = member_in(&t.members, &name)? else {
                return Err(StateError::NoSuchMember { name });
            };
            member.readmit = true;
            put_member(&mut t.members, &member)?;
            Ok(member)
        })
        .await
    }

    async fn admit(&self, a: Admission) -> Result<ExpiringToken, StateError> {
        self.write(move |t| admit_in(t, &a)).await
    }

    async fn members(&self) -> Result<Vec<Member>, StateError> {
        self.blocking(|db| {
            let read = db.begin_read().map_err(store)?;
            let table = read.open_table(MEMBERS).map_err(store)?;
            let mut out = Vec::new();
            for entry in table.iter().map_err(store)? {
                let (_, v) = entry.map_err(store)?;
                out.push(serde_json::from_slice(v.value()).map_err(store)?);
            }
            Ok(out)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use asterism_cluster::Role;

    /// A test AK identity named by `label` (its first bytes).
    fn fp(label: &str) -> AkFingerprint {
        let mut bytes = [0u8; 32];
        bytes[..label.len()].copy_from_slice(label.as_bytes());
        AkFingerprint::from(bytes)
    }

    fn admission(name: &str, ak: &str, disk: &str, now: SystemTime) -> Admission {
        Admission {
            name: name.into(),
            role: Role::Worker,
            ak: fp(ak),
            disk: DiskUuid::parse(disk).unwrap(),
            now,
        }
    }

    const D1: &str = "11111111-1111-1111-1111-111111111111";
    const D2: &str = "22222222-2222-2222-2222-222222222222";

    #[test]
    fn minted_tokens_have_the_kubeadm_format() {
        for _ in 0..100 {
            let t = generate_token().unwrap();
            assert!(asterism_cluster::is_bootstrap_token(t.expose_secret()));
        }
    }

    #[tokio::test]
    async fn a_disk_stays_with_the_first_key_that_asked_for_it() {
        let dir = tempfile::tempdir().unwrap();
        let s = RedbState::open(dir.path()).unwrap();
        let now = SystemTime::now();
        let d = DiskUuid::parse(D1).unwrap();
        s.check_disk(&d, &fp("ak-b"), "n").await.unwrap();
        s.admit(admission("a", "ak-a", D1, now)).await.unwrap();
        s.check_disk(&d, &fp("ak-a"), "n").await.unwrap();
        assert!(matches!(
            s.check_disk(&d, &fp("ak-b"), "n").await,
            Err(StateError::DiskBoundToOtherKey { .. })
        ));
        // Admission with a foreign disk writes nothing.
        assert!(matches!(
            s.admit(admission("n", "ak-b", D1, now)).await,
            Err(StateError::DiskBoundToOtherKey { .. })
        ));
        let names: Vec<_> = s
            .members()
            .await
            .unwrap()
            .into_iter()
            .map(|m| m.name)
            .collect();
        assert_eq!(names, ["a"]);
    }

    #[tokio::test]
    async fn a_key_has_one_disk_and_a_second_needs_an_operator() {
        let dir = tempfile::tempdir().unwrap();
        let s = RedbState::open(dir.path()).unwrap();
        let now = SystemTime::now();
        let (d1, d2) = (DiskUuid::parse(D1).unwrap(), DiskUuid::parse(D2).unwrap());
        s.admit(admission("a", "ak-a", D1, now)).await.unwrap();
        // Its own disk again: fine. Another (unbound) disk, under its own name or another:
        // refused, before and in the transaction, and nothing is bound.
        s.check_disk(&d1, &fp("ak-a"), "a").await.unwrap();
        s.admit(admission("a", "ak-a", D1, now)).await.unwrap();
        // (Under another name the admission is refused first because the key is member
        // "a": one key is one node.)
        for name in ["a", "victim"] {
            assert!(matches!(
                s.check_disk(&d2, &fp("ak-a"), name).await,
                Err(StateError::SecondDisk { .. })
            ));
            let refused = s.admit(admission(name, "ak-a", D2, now)).await;
            if name == "a" {
                assert!(matches!(refused, Err(StateError::SecondDisk { .. })));
            } else {
                assert!(matches!(
                    refused,
                    Err(StateError::KeyIsAnotherMember { .. })
                ));
            }
        }
        s.check_disk(&d2, &fp("ak-v"), "victim").await.unwrap();
        // After an operator's re-admission, the member's key may take a new disk, once.
        s.allow_readmission("a").await.unwrap();
        s.check_disk(&d2, &fp("ak-a"), "a").await.unwrap();
        s.admit(admission("a", "ak-a", D2, now)).await.unwrap();
        s.check_rejoin(&d2, &fp("ak-a")).await.unwrap();
        assert_eq!(s.members().await.unwrap()[0].disk, D2);
        // The index survives reopening.
        drop(s);
        let s = RedbState::open(dir.path()).unwrap();
        s.admit(admission("a", "ak-a", D2, now)).await.unwrap();
    }

    /// The check before a ticket's signatures refuses what the admission would, each
    /// refusal of both kinds, and writes nothing.
    #[tokio::test]
    async fn the_check_before_signing_refuses_what_the_admission_would() {
        let dir = tempfile::tempdir().unwrap();
        let s = RedbState::open(dir.path()).unwrap();
        let now = UNIX_EPOCH + Duration::from_secs(5_000_000);
        s.admit(admission("a", "ak-a", D1, now)).await.unwrap();
        type Is = fn(&StateError) -> bool;
        let refused: [(Admission, Is); 5] = [
            // Member checks, for requests the disk checks let through: a's record with
            // another key or role; a's key under another name, with a's own disk.
            (admission("a", "ak-b", D2, now), |e| {
                matches!(e, StateError::MemberKeyChanged { .. })
            }),
            (
                Admission {
                    role: Role::ControlPlane,
                    ..admission("a", "ak-a", D1, now)
                },
                |e| matches!(e, StateError::MemberRoleChanged { .. }),
            ),
            (admission("m", "ak-a", D1, now), |e| {
                matches!(e, StateError::KeyIsAnotherMember { .. })
            }),
            // Disk checks: a's disk for another key; a second disk for a's key.
            (admission("n", "ak-b", D1, now), |e| {
                matches!(e, StateError::DiskBoundToOtherKey { .. })
            }),
            (admission("a", "ak-a", D2, now), |e| {
                matches!(e, StateError::SecondDisk { .. })
            }),
        ];
        for (a, is) in refused {
            let checked = s.check_admission(&a).await.unwrap_err();
            assert!(is(&checked), "{a:?}: {checked:?}");
            let admitted = s.admit(a.clone()).await.unwrap_err();
            assert!(is(&admitted), "{a:?}: {admitted:?}");
        }
        s.check_admission(&admission("a", "ak-a", D1, now))
            .await
            .unwrap();
        s.check_admission(&admission("n", "ak-b", D2, now))
            .await
            .unwrap();
        let members = s.members().await.unwrap();
        assert_eq!(members.len(), 1);
        assert_eq!(members[0].tickets, 1);
    }

    #[tokio::test]
    async fn a_rejoin_needs_a_disk_bound_to_its_own_key() {
        let dir = tempfile::tempdir().unwrap();
        let s = RedbState::open(dir.path()).unwrap();
        let d = DiskUuid::parse(D1).unwrap();
        assert!(matches!(
            s.check_rejoin(&d, &fp("ak-a")).await,
            Err(StateError::DiskUnbound { .. })
        ));
        // Asking binds nothing: the key that asked first gets no claim.
        assert!(s.check_rejoin(&d, &fp("ak-a")).await.is_err());
        s.admit(admission("a", "ak-a", D1, SystemTime::now()))
            .await
            .unwrap();
        s.check_rejoin(&d, &fp("ak-a")).await.unwrap();
        assert!(matches!(
            s.check_rejoin(&d, &fp("ak-b")).await,
            Err(StateError::DiskBoundToOtherKey { .. })
        ));
    }

    /// One key is one node, in the admission's own transaction as well as in the check
    /// before it, and in a store written before the key index existed; a key replaced
    /// after a re-admission leaves the index, so the machine that had it may join anew.
    #[tokio::test]
    async fn a_members_key_is_one_node_also_in_a_store_from_before_the_index() {
        let dir = tempfile::tempdir().unwrap();
        let now = UNIX_EPOCH + Duration::from_secs(5_000_000);
        {
            let s = RedbState::open(dir.path()).unwrap();
            s.admit(admission("n", "ak-a", D1, now)).await.unwrap();
            // The admission's transaction refuses what the check would have.
            let err = s.admit(admission("m", "ak-a", D1, now)).await.unwrap_err();
            assert!(
                matches!(&err, StateError::KeyIsAnotherMember { member, .. } if member == "n"),
                "{err:?}"
            );
        }
        // As a store from before the index: the table is gone.
        {
            let db = redb::Database::open(dir.path().join(RedbState::FILE_NAME)).unwrap();
            let txn = db.begin_write().unwrap();
            assert!(txn.delete_table(AK_MEMBERS).unwrap());
            txn.commit().unwrap();
        }
        let s = RedbState::open(dir.path()).unwrap();
        assert!(matches!(
            s.check_member("m", &fp("ak-a"), Role::Worker).await,
            Err(StateError::KeyIsAnotherMember { .. })
        ));
        s.check_member("n", &fp("ak-a"), Role::Worker)
            .await
            .unwrap();
        // n's machine is replaced: ak-b takes n over, and ak-a is no member any more.
        s.allow_readmission("n").await.unwrap();
        s.admit(admission("n", "ak-b", D2, now)).await.unwrap();
        s.check_member("m", &fp("ak-a"), Role::Worker)
            .await
            .unwrap();
        assert!(matches!(
            s.check_member("m", &fp("ak-b"), Role::Worker).await,
            Err(StateError::KeyIsAnotherMember { .. })
        ));
    }

    #[tokio::test]
    async fn a_member_keeps_its_role_until_an_operator_readmits_it() {
        let dir = tempfile::tempdir().unwrap();
        let s = RedbState::open(dir.path()).unwrap();
        let now = UNIX_EPOCH + Duration::from_secs(5_000_000);
        s.admit(admission("n", "ak-a", D1, now)).await.unwrap();
        // Same key, same disk, the metadata now says control plane: refused, both by the
        // check and by the admission's transaction, which writes nothing.
        let as_cp = Admission {
            role: Role::ControlPlane,
            ..admission("n", "ak-a", D1, now)
        };
        let refused = |r: Result<(), StateError>| matches!(r, Err(StateError::MemberRoleChanged { ref was, asked: Role::ControlPlane, .. }) if was == "Worker");
        assert!(refused(
            s.check_member("n", &fp("ak-a"), Role::ControlPlane).await
        ));
        assert!(refused(s.admit(as_cp.clone()).await.map(|_| ())));
        assert_eq!(s.members().await.unwrap()[0].role, "Worker");
        // An operator re-admits the node: its next ticket may come in the new role.
        s.allow_readmission("n").await.unwrap();
        s.check_member("n", &fp("ak-a"), Role::ControlPlane)
            .await
            .unwrap();
        s.admit(as_cp).await.unwrap();
        assert_eq!(s.members().await.unwrap()[0].role, "ControlPlane");
    }

    #[tokio::test]
    async fn a_member_with_another_key_is_refused_until_an_operator_readmits_it() {
        let dir = tempfile::tempdir().unwrap();
        let s = RedbState::open(dir.path()).unwrap();
        let now = UNIX_EPOCH + Duration::from_secs(5_000_000);
        s.admit(admission("n", "ak-a", D1, now)).await.unwrap();
        s.check_member("n", &fp("ak-a"), Role::Worker)
            .await
            .unwrap();
        s.check_member("other", &fp("ak-b"), Role::Worker)
            .await
            .unwrap();
        assert!(matches!(
            s.check_member("n", &fp("ak-b"), Role::Worker).await,
            Err(StateError::MemberKeyChanged { .. })
        ));
        assert!(matches!(
            s.admit(admission("n", "ak-b", D2, now)).await,
            Err(StateError::MemberKeyChanged { .. })
        ));
        // The refusal wrote nothing: neither the member nor the new disk.
        assert_eq!(s.members().await.unwrap()[0].ak, fp("ak-a").to_string());
        assert!(matches!(
            s.check_rejoin(&DiskUuid::parse(D2).unwrap(), &fp("ak-b"))
                .await,
            Err(StateError::DiskUnbound { .. })
        ));

        assert!(matches!(
            s.allow_readmission("nobody").await,
            Err(StateError::NoSuchMember { .. })
        ));
        assert!(s.allow_readmission("n").await.unwrap().readmit);
        s.check_member("n", &fp("ak-b"), Role::Worker)
            .await
            .unwrap();
        s.admit(admission("n", "ak-b", D2, now + Duration::from_secs(1)))
            .await
            .unwrap();
        let m = &s.members().await.unwrap()[0];
        assert_eq!(
            (m.ak.clone(), m.readmit, m.tickets),
            (fp("ak-b").to_string(), false, 2)
        );
        // One re-admission, one key change: the old key is now the stranger.
        assert!(matches!(
            s.admit(admission("n", "ak-a", D1, now)).await,
            Err(StateError::MemberKeyChanged { .. })
        ));
    }

    #[tokio::test]
    async fn the_init_node_is_recorded_once_and_its_disk_is_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let now = UNIX_EPOCH + Duration::from_secs(6_000_000);
        let init = InitNode {
            disk: D1.into(),
            ak: fp("ak-cp").to_string(),
            name: "cp-0".into(),
            role: Role::ControlPlane,
            ..Default::default()
        };
        {
            let s = RedbState::open(dir.path()).unwrap();
            s.record_init_node(&init, now).await.unwrap();
        }
        let s = RedbState::open(dir.path()).unwrap();
        // Again at the next start: nothing changes.
        s.record_init_node(&init, now + Duration::from_secs(60))
            .await
            .unwrap();
        let members = s.members().await.unwrap();
        assert_eq!(members.len(), 1);
        assert_eq!(
            (members[0].name.as_str(), members[0].ak.clone()),
            ("cp-0", fp("ak-cp").to_string())
        );
        assert_eq!(
            (members[0].role.as_str(), members[0].admitted_at),
            ("ControlPlane", 6_000_000)
        );
        let d = DiskUuid::parse(D1).unwrap();
        s.check_rejoin(&d, &fp("ak-cp")).await.unwrap();
        assert!(matches!(
            s.check_rejoin(&d, &fp("ak-worker")).await,
            Err(StateError::DiskBoundToOtherKey { .. })
        ));
        assert!(
            s.admit(admission("worker-0", "ak-worker", D1, now))
                .await
                .is_err()
        );
        // A record that disagrees with the state is refused and changes nothing.
        let other = InitNode {
            ak: fp("ak-other").to_string(),
            ..init.clone()
        };
        assert!(matches!(
            s.record_init_node(&other, now).await,
            Err(StateError::MemberKeyChanged { .. })
        ));
        let moved = InitNode {
            name: "cp-1".into(),
            ..other
        };
        assert!(matches!(
            s.record_init_node(&moved, now).await,
            Err(StateError::DiskBoundToOtherKey { .. })
        ));
        assert_eq!(s.members().await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn an_init_node_record_whose_ak_is_no_ak_identity_is_refused_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let s = RedbState::open(dir.path()).unwrap();
        for ak in ["ak of the init node".to_owned(), "ab".repeat(31)] {
            let init = InitNode {
                disk: D1.into(),
                ak,
                name: "cp-0".into(),
                role: Role::ControlPlane,
                ..Default::default()
            };
            assert!(matches!(
                s.record_init_node(&init, SystemTime::now()).await,
                Err(StateError::Store { what, .. }) if what.contains("attestation key identity")
            ));
        }
        assert!(s.members().await.unwrap().is_empty());
        // Its disk stays unbound: any key may still bind it.
        s.check_disk(&DiskUuid::parse(D1).unwrap(), &fp("ak-a"), "n")
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn tokens_are_reused_while_they_have_five_minutes_left() {
        let dir = tempfile::tempdir().unwrap();
        let s = RedbState::open(dir.path()).unwrap();
        let t0 = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let a = s.admit(admission("a", "ak-a", D1, t0)).await.unwrap();
        let b = s
            .admit(admission("b", "ak-b", D2, t0 + Duration::from_secs(9 * 60)))
            .await
            .unwrap();
        assert_eq!(a.token.expose_secret(), b.token.expose_secret());
        assert_eq!(a.expires, t0 + TOKEN_TTL);
        assert_eq!(b.expires, a.expires);
        // 10 min 1 s later the token has less than 5 min left: a new one.
        let c = s
            .admit(admission(
                "b",
                "ak-b",
                D2,
                t0 + Duration::from_secs(10 * 60 + 1),
            ))
            .await
            .unwrap();
        assert_ne!(a.token.expose_secret(), c.token.expose_secret());
        // Of two tokens with time enough left (a clock set back sees both so), the one
        // that lasts longer.
        let d = s.admit(admission("b", "ak-b", D2, t0)).await.unwrap();
        assert_eq!(d.token.expose_secret(), c.token.expose_secret());
        assert_eq!(d.expires, c.expires);
    }

    fn pending<T: Send + 'static>(
        run: impl for<'a> FnOnce(&mut Tables<'a>) -> Result<T, StateError> + Send + 'static,
    ) -> (
        Box<dyn PendingWrite>,
        oneshot::Receiver<Result<T, StateError>>,
    ) {
        let (reply, answer) = oneshot::channel();
        let pending = Box::new(Pending {
            run: Some(Box::new(run)),
            outcome: None,
            reply,
        });
        (pending, answer)
    }

    /// Runs `batch` as the writer thread does: one transaction, then the answers.
    fn run_batch(dir: &Path, mut batch: Vec<Box<dyn PendingWrite>>) {
        let db = Database::create(dir.join(RedbState::FILE_NAME)).unwrap();
        let failure = commit(&db, &mut batch).err().map(Arc::new);
        for w in batch {
            w.answer(failure.as_ref());
        }
    }

    #[tokio::test]
    async fn a_refused_write_leaves_the_others_of_its_transaction_committed() {
        let dir = tempfile::tempdir().unwrap();
        drop(RedbState::open(dir.path()).unwrap());
        let now = UNIX_EPOCH + Duration::from_secs(3_000_000);
        let a = admission("a", "ak-a", D1, now);
        let b = admission("b", "ak-b", D1, now);
        let c = admission("c", "ak-c", D2, now);
        let (wa, ra) = pending(move |t| admit_in(t, &a));
        let (wb, rb) = pending(move |t| admit_in(t, &b));
        let (wc, rc) = pending(move |t| admit_in(t, &c));
        run_batch(dir.path(), vec![wa, wb, wc]);
        let ta = ra.await.unwrap().unwrap();
        assert!(matches!(
            rb.await.unwrap(),
            Err(StateError::DiskBoundToOtherKey { .. })
        ));
        let tc = rc.await.unwrap().unwrap();
        assert_eq!(
            ta.token.expose_secret(),
            tc.token.expose_secret(),
            "one token per burst"
        );

        let s = RedbState::open(dir.path()).unwrap();
        let names: Vec<_> = s
            .members()
            .await
            .unwrap()
            .into_iter()
            .map(|m| m.name)
            .collect();
        assert_eq!(names, ["a", "c"]);
        s.check_disk(&DiskUuid::parse(D1).unwrap(), &fp("ak-a"), "cp-0")
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_failed_write_aborts_its_transaction_and_every_write_in_it_fails() {
        let dir = tempfile::tempdir().unwrap();
        drop(RedbState::open(dir.path()).unwrap());
        let now = UNIX_EPOCH + Duration::from_secs(3_000_000);
        let a = admission("a", "ak-a", D1, now);
        let (wa, ra) = pending(move |t| admit_in(t, &a));
        // Writes half of something, then fails.
        let (wb, rb) = pending(|t| {
            t.members.insert("b", b"{}".as_slice()).map_err(store)?;
            Err::<(), _>(StateError::store_failed("the disk is full"))
        });
        run_batch(dir.path(), vec![wa, wb]);
        assert!(
            matches!(ra.await.unwrap(), Err(e @ StateError::Store { .. }) if asterism_binkit::error_chain(&e).contains("full"))
        );
        assert!(rb.await.unwrap().is_err());

        let s = RedbState::open(dir.path()).unwrap();
        assert!(s.members().await.unwrap().is_empty());
        s.check_disk(&DiskUuid::parse(D1).unwrap(), &fp("ak-other"), "cp-0")
            .await
            .unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_admissions_are_all_committed_and_answered_after_their_commit() {
        let dir = tempfile::tempdir().unwrap();
        let now = UNIX_EPOCH + Duration::from_secs(4_000_000);
        {
            let s = RedbState::open(dir.path()).unwrap();
            let tasks: Vec<_> = (0..200)
                .map(|i| {
                    let s = s.clone();
                    let disk = format!("{i:08x}-0000-4000-8000-000000000000");
                    tokio::spawn(async move {
                        s.admit(admission(&format!("n{i}"), &format!("ak-{i}"), &disk, now))
                            .await
                            .map(|t| t.token.expose_secret().to_owned())
                    })
                })
                .collect();
            let mut tokens = std::collections::BTreeSet::new();
            for t in tasks {
                tokens.insert(t.await.unwrap().unwrap());
            }
            assert_eq!(tokens.len(), 1, "one token for the whole burst");
            // Every answer came after its commit: a reader sees every member right away.
            assert_eq!(s.members().await.unwrap().len(), 200);
        }
        let s = RedbState::open(dir.path()).unwrap();
        assert_eq!(s.members().await.unwrap().len(), 200);
    }

    #[tokio::test]
    async fn one_member_per_name_and_the_state_survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let now = UNIX_EPOCH + Duration::from_secs(2_000_000);
        let token = {
            let s = RedbState::open(dir.path()).unwrap();
            s.admit(admission("n", "ak-a", D1, now)).await.unwrap();
            s.admit(admission("n", "ak-a", D1, now + Duration::from_secs(5)))
                .await
                .unwrap()
                .token
                .expose_secret()
                .to_owned()
        };
        let s = RedbState::open(dir.path()).unwrap();
        let members = s.members().await.unwrap();
        assert_eq!(members.len(), 1);
        assert_eq!(members[0].admitted_at, 2_000_000);
        assert_eq!(members[0].last_ticket_at, 2_000_005);
        assert_eq!(members[0].tickets, 2);
        let again = s
            .admit(admission("m", "ak-b", D2, now + Duration::from_secs(6)))
            .await
            .unwrap();
        assert_eq!(again.token.expose_secret(), token);
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(dir.path().join(RedbState::FILE_NAME))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
