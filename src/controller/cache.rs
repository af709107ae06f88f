//! Watch-fed caches of what a pass reads (decision 41): the objects of every cluster, indexed by
//! namespace and cluster so that a pass finds its own without scanning the others, kept by the
//! same watch streams that trigger the passes (an event is in the cache before the pass it
//! triggers starts). An idle cluster's pass sends no request to the API server: it reads these
//! caches, and the Secrets it references only when their resourceVersion changed.
//!
//! A pass never plans from caches that have not yet seen the operator's own writes: each write
//! is remembered with what the API server answered ([`Caches::wrote`]), and the next pass waits
//! for the caches to show it ([`Caches::await_writes`], milliseconds as the watches go). A
//! cluster whose writes the caches did not show in time, or whose pass failed midway, is
//! observed from the API server instead ([`Caches::dirty`]) until the caches hold every object
//! a pass read at the resourceVersion it read.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use futures::{Stream, TryStreamExt};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{Controller, WatchStreamExt};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::kinds::cluster_kinds;
use super::kube::namespaced_or_all;
use crate::api::{ClickHouseBackup, ClickHouseCluster};
use crate::model::labels;
use crate::plan::facts::Kind;

type Key = (String, String);

/// An object as the caches keep it: its JSON, without managed fields. Deserialized objects are
/// many times larger than their JSON (k8s-openapi keeps every optional field inline: a `Volume`
/// is over 3 KiB, a `Container` over 2 KiB), and a thousand clusters' pods and StatefulSets
/// held that way were most of the operator's memory; a pass reads only its own cluster's few
/// objects back.
type Stored = Arc<[u8]>;

/// An object of a relist: its group, its key and the object as stored.
type Listed = (Option<String>, Key, Stored);

/// The objects of one watch, by (namespace, name) and by (namespace, group): the group is the
/// cluster an object belongs to (its `clickhouse.com/cluster` label, or the cluster a backup
/// names).
pub struct Index<K> {
    group_of: fn(&K) -> Option<String>,
    inner: RwLock<Inner>,
    /// Objects of a relist (after `Init`), swapped in at `InitDone`.
    relist: Mutex<Option<Vec<Listed>>>,
    synced: AtomicBool,
}

#[derive(Default)]
struct Inner {
    objects: HashMap<Key, (Option<String>, Stored)>,
    groups: HashMap<Key, BTreeMap<String, Stored>>,
    /// Per group with members: a stamp taken when its members last changed (see [`stamp`]).
    group_stamps: HashMap<Key, u64>,
    /// Per namespace: a stamp taken when an object of it last changed.
    namespace_stamps: HashMap<String, u64>,
}

/// A number never handed out before, by any index: two equal stamps of a group (or a
/// namespace) taken at different times mean that nothing of it changed in between, relists
/// included (decision 60).
fn stamp() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl Inner {
    fn insert(&mut self, group: Option<String>, (ns, name): Key, o: Stored) {
        self.remove(&ns, &name);
        if let Some(g) = &group {
            let key = (ns.clone(), g.clone());
            self.groups
                .entry(key.clone())
                .or_default()
                .insert(name.clone(), o.clone());
            self.group_stamps.insert(key, stamp());
        }
        self.namespace_stamps.insert(ns.clone(), stamp());
        self.objects.insert((ns, name), (group, o));
    }

    fn remove(&mut self, ns: &str, name: &str) {
        let Some((group, _)) = self.objects.remove(&(ns.to_string(), name.to_string())) else {
            return;
        };
        self.namespace_stamps.insert(ns.to_string(), stamp());
        let Some(g) = group else {
            return;
        };
        let key = (ns.to_string(), g);
        if let Some(members) = self.groups.get_mut(&key) {
            members.remove(name);
            if members.is_empty() {
                self.groups.remove(&key);
                self.group_stamps.remove(&key);
            } else {
                self.group_stamps.insert(key, stamp());
            }
        }
    }
}

/// What the caches keep of an object: everything but the operator's and Kubernetes' own
/// entries of its managed fields (the largest part of many objects); the entries of other
/// writers stay, so that a pass sees a hand edit to repair ([`crate::model::diff::foreign_fields`]).
fn trim<K: Resource>(mut o: K) -> K {
    let meta = o.meta_mut();
    if let Some(entries) = meta.managed_fields.take() {
        use crate::model::diff::{FIELD_MANAGER, is_foreign_entry};
        let foreign: Vec<_> = entries
            .into_iter()
            .filter(|e| serde_json::to_value(e).is_ok_and(|v| is_foreign_entry(&v, FIELD_MANAGER)))
            .collect();
        meta.managed_fields = (!foreign.is_empty()).then_some(foreign);
    }
    o
}

impl<K: Resource + Clone + Serialize + DeserializeOwned> Index<K> {
    pub fn new(group_of: fn(&K) -> Option<String>) -> Arc<Self> {
        Arc::new(Index {
            group_of,
            inner: RwLock::new(Inner::default()),
            relist: Mutex::new(None),
            synced: AtomicBool::new(false),
        })
    }

    /// The group, key and stored form of an object.
    fn store(&self, o: &K) -> Listed {
        let key = (
            o.meta().namespace.clone().unwrap_or_default(),
            o.meta().name.clone().unwrap_or_default(),
        );
        let json = serde_json::to_vec(&trim(o.clone())).unwrap_or_default();
        ((self.group_of)(o), key, json.into())
    }

    fn load(stored: &[u8]) -> Option<K> {
        serde_json::from_slice(stored).ok()
    }

    /// Applies one watch event.
    pub fn apply(&self, event: &Event<K>) {
        match event {
            Event::Init => *self.relist.lock().unwrap() = Some(Vec::new()),
            Event::InitApply(o) => {
                let stored = self.store(o);
                self.relist
                    .lock()
                    .unwrap()
                    .get_or_insert_with(Vec::new)
                    .push(stored);
            }
            Event::InitDone => {
                let listed = self.relist.lock().unwrap().take().unwrap_or_default();
                let mut fresh = Inner::default();
                for (group, key, o) in listed {
                    fresh.insert(group, key, o);
                }
                *self.inner.write().unwrap() = fresh;
                self.synced.store(true, Ordering::Release);
            }
            Event::Apply(o) => {
                let (group, key, stored) = self.store(o);
                self.inner.write().unwrap().insert(group, key, stored);
            }
            Event::Delete(o) => self.inner.write().unwrap().remove(
                o.meta().namespace.as_deref().unwrap_or_default(),
                o.meta().name.as_deref().unwrap_or_default(),
            ),
        }
    }

    /// The objects of cluster `group` in `ns`, by name.
    pub fn group(&self, ns: &str, group: &str) -> Vec<K> {
        let stored: Vec<Stored> = self
            .inner
            .read()
            .unwrap()
            .groups
            .get(&(ns.to_string(), group.to_string()))
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default();
        stored.iter().filter_map(|o| Self::load(o)).collect()
    }

    /// The resourceVersion and uid of an object as cached, without reading the rest of it.
    pub fn meta(&self, ns: &str, name: &str) -> Option<(String, Option<String>)> {
        #[derive(serde::Deserialize)]
        struct Lite {
            metadata: LiteMeta,
        }
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct LiteMeta {
            resource_version: Option<String>,
            uid: Option<String>,
        }
        let lite: Lite = serde_json::from_slice(&self.stored(ns, name)?).ok()?;
        Some((
            lite.metadata.resource_version.unwrap_or_default(),
            lite.metadata.uid,
        ))
    }

    pub fn get(&self, ns: &str, name: &str) -> Option<Arc<K>> {
        Self::load(&self.stored(ns, name)?).map(Arc::new)
    }

    /// An object as stored.
    fn stored(&self, ns: &str, name: &str) -> Option<Stored> {
        self.inner
            .read()
            .unwrap()
            .objects
            .get(&(ns.to_string(), name.to_string()))
            .map(|(_, o)| o.clone())
    }
}

impl<K> Index<K> {
    /// The stamp of cluster `group`'s objects in `ns`: it changes whenever one of them is
    /// added, changed or removed, or the index is listed again (`None`: it has none).
    pub fn stamp(&self, ns: &str, group: &str) -> Option<u64> {
        let inner = self.inner.read().unwrap();
        inner
            .group_stamps
            .get(&(ns.to_string(), group.to_string()))
            .copied()
    }

    /// The stamp of the objects in `ns`, as [`Index::stamp`] for a whole namespace.
    pub fn namespace_stamp(&self, ns: &str) -> Option<u64> {
        self.inner.read().unwrap().namespace_stamps.get(ns).copied()
    }

    /// Whether the first list has been received.
    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// How many objects are cached.
    pub fn len(&self) -> usize {
        self.inner.read().unwrap().objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The cluster label of an object.
pub fn cluster_label<K: Resource>(o: &K) -> Option<String> {
    o.labels().get(labels::CLUSTER).cloned()
}

/// A watch of `api` that keeps `index` and yields the objects it touched (for the triggers).
/// With `Api<PartialObjectMeta<K>>` it asks for metadata only.
pub fn feed<K>(
    index: Arc<Index<K>>,
    api: Api<K>,
    config: watcher::Config,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug + Send + Sync + 'static,
{
    kube::runtime::watcher(api, config)
        .default_backoff()
        .map_ok(move |e| {
            index.apply(&e);
            e
        })
        .touched_objects()
}

/// Declares [`Indexes`] and the watches that keep them from the table of kinds.
macro_rules! indexes {
    ($($kind:ident($ty:ty) $field:ident $trigger:ident;)*) => {
        /// The caches of the kinds of a cluster's objects ([`cluster_kinds!`]): one [`Index`] per
        /// kind and watched namespace (or one for all), grouped by cluster label.
        #[derive(Default)]
        pub struct Indexes {
            $(pub $field: Vec<Arc<Index<$ty>>>,)*
        }

        impl Indexes {
            /// Whether every one has received its first list.
            fn synced(&self) -> bool {
                true $(&& all_synced(&self.$field))*
            }

            /// The resourceVersion and uid of an object of `kind` as cached (`None`: absent).
            fn meta(&self, kind: Kind, ns: &str, name: &str) -> Option<(String, Option<String>)> {
                match kind {
                    $(Kind::$kind => find(&self.$field, ns, name),)*
                }
            }

            /// The stamps of cluster `group`'s objects in `ns`, one per kind and index.
            fn stamps(&self, ns: &str, group: &str, out: &mut Vec<Option<u64>>) {
                $(out.extend(self.$field.iter().map(|i| i.stamp(ns, group)));)*
            }

            /// Objects cached, by kind.
            fn sizes(&self) -> Vec<(&'static str, usize)> {
                vec![$((Kind::$kind.as_str(), count(&self.$field)),)*]
            }
        }

        /// Adds to `ctl` a watch of each kind of a cluster's objects in `ns` (`None`: in every
        /// namespace), each keeping a new [`Index`] of `indexes` before it triggers the pass of
        /// the object's cluster, so that a pass sees the event that started it.
        pub fn watch(
            mut ctl: Controller<ClickHouseCluster>,
            indexes: &mut Indexes,
            client: &Client,
            ns: Option<&str>,
        ) -> Controller<ClickHouseCluster> {
            let owned = watcher::Config::default().labels(labels::CLUSTER);
            $(
                let index = Index::new(cluster_label);
                indexes.$field.push(index.clone());
                let objects = feed(index, namespaced_or_all::<$ty>(client, ns), owned.clone());
                ctl = trigger!($trigger, ctl, objects, $ty);
            )*
            ctl
        }
    };
}

/// How a change of an object triggers its cluster's pass (see [`cluster_kinds!`]).
macro_rules! trigger {
    (owned, $ctl:expr, $objects:expr, $ty:ty) => {
        $ctl.owns_stream($objects)
    };
    (labelled, $ctl:expr, $objects:expr, $ty:ty) => {
        $ctl.watches_stream($objects, by_label::<$ty>)
    };
}

cluster_kinds!(indexes);

/// The cluster of an object, by its label.
fn by_label<K: Resource>(o: K) -> Option<ObjectRef<ClickHouseCluster>> {
    let ns = o.meta().namespace.clone()?;
    let name = o.meta().labels.as_ref()?.get(labels::CLUSTER)?.clone();
    Some(ObjectRef::new(&name).within(&ns))
}

fn find<K: Resource + Clone + Serialize + DeserializeOwned>(
    list: &[Arc<Index<K>>],
    ns: &str,
    name: &str,
) -> Option<(String, Option<String>)> {
    list.iter().find_map(|i| i.meta(ns, name))
}

fn count<K>(list: &[Arc<Index<K>>]) -> usize {
    list.iter().map(|i| i.len()).sum()
}

/// Every cache a pass reads.
#[derive(Default)]
pub struct Caches {
    /// The objects of the clusters, by kind.
    pub objects: Indexes,
    /// Every Secret's metadata: whether a referenced Secret exists, and its resourceVersion.
    pub secret_meta: Vec<Arc<Index<PartialObjectMeta<Secret>>>>,
    /// Backups, grouped by the cluster they name.
    pub backups: Vec<Arc<Index<ClickHouseBackup>>>,
    /// The data of referenced Secrets as last read, with the resourceVersion it was read at.
    secret_data: Mutex<HashMap<Key, (String, Arc<Secret>)>>,
    /// Clusters to observe from the API server (see the module's documentation).
    dirty: Mutex<HashSet<Key>>,
    /// Per cluster: its passes' own writes the caches have not shown yet, the latest per object.
    writes: Mutex<HashMap<Key, Vec<Write>>>,
}

/// One of a pass's own writes, as the caches must show it before a pass plans from them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Write {
    pub kind: Kind,
    pub name: String,
    pub seen: Seen,
}

/// What shows a write in the caches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    /// The object at this resourceVersion, or at a later one.
    Version(String),
    /// The object deleted: absent, another object (another uid) under its name, or (when
    /// the deletion waits for finalizers or a grace period) the object at this resourceVersion
    /// or a later one.
    Gone {
        uid: Option<String>,
        version: Option<String>,
    },
}

impl Write {
    /// A write whose answer was the object as written.
    pub fn of<K: Resource>(kind: Kind, object: &K) -> Write {
        Write {
            kind,
            name: object.meta().name.clone().unwrap_or_default(),
            seen: Seen::Version(object.meta().resource_version.clone().unwrap_or_default()),
        }
    }

    /// Whether an object as cached (resourceVersion and uid, `None`: absent) shows it.
    fn shown_by(&self, cached: Option<&(String, Option<String>)>) -> bool {
        // resourceVersions are compared as the API server's etcd revisions they are; one that
        // does not parse counts only when equal
        let at_least = |have: &str, want: &str| {
            have == want
                || matches!(
                    (have.parse::<u64>(), want.parse::<u64>()),
                    (Ok(h), Ok(w)) if h > w
                )
        };
        match (&self.seen, cached) {
            (Seen::Version(_), None) => false,
            (Seen::Version(want), Some((have, _))) => at_least(have, want),
            (Seen::Gone { .. }, None) => true,
            (Seen::Gone { uid, version }, Some((have, have_uid))) => {
                (uid.is_some() && have_uid != uid)
                    || version.as_deref().is_some_and(|v| at_least(have, v))
            }
        }
    }
}

fn all_synced<K>(list: &[Arc<Index<K>>]) -> bool {
    !list.is_empty() && list.iter().all(|i| i.synced())
}

pub fn group<K: Resource + Clone + Serialize + DeserializeOwned>(
    list: &[Arc<Index<K>>],
    ns: &str,
    name: &str,
) -> Vec<K> {
    list.iter().flat_map(|i| i.group(ns, name)).collect()
}

impl Caches {
    /// Whether every cache has received its first list.
    pub fn synced(&self) -> bool {
        self.objects.synced() && all_synced(&self.secret_meta) && all_synced(&self.backups)
    }

    /// Whether the cluster is to be observed from the API server.
    pub fn dirty(&self, ns: &str, name: &str) -> bool {
        self.dirty
            .lock()
            .unwrap()
            .contains(&(ns.to_string(), name.to_string()))
    }

    /// After a pass that wrote (or was about to write) to Kubernetes, or after a pass of
    /// nothing to write: the next one observes from the API server, or from the caches.
    pub fn set_dirty(&self, ns: &str, name: &str, dirty: bool) {
        let key = (ns.to_string(), name.to_string());
        let mut d = self.dirty.lock().unwrap();
        if dirty {
            d.insert(key);
        } else {
            d.remove(&key);
        }
    }

    /// The resourceVersion of Secret `name` in `ns` as the metadata watch has it (`None`: there
    /// is no such Secret).
    pub fn secret_version(&self, ns: &str, name: &str) -> Option<String> {
        self.secret_meta
            .iter()
            .find_map(|i| i.get(ns, name))
            .map(|m| m.resource_version().unwrap_or_default())
    }

    /// The data of Secret `name` read at `version`, if it was.
    pub fn secret_at(&self, ns: &str, name: &str, version: &str) -> Option<Arc<Secret>> {
        self.secret_data
            .lock()
            .unwrap()
            .get(&(ns.to_string(), name.to_string()))
            .filter(|(v, _)| v == version)
            .map(|(_, s)| s.clone())
    }

    /// Remembers a Secret's data as just read.
    pub fn remember_secret(&self, secret: &Secret) {
        let ns = secret.namespace().unwrap_or_default();
        let name = secret.name_any();
        let version = secret.resource_version().unwrap_or_default();
        self.secret_data
            .lock()
            .unwrap()
            .insert((ns, name), (version, Arc::new(trim(secret.clone()))));
    }

    /// Remembers one of the pass's own writes to an object of cluster `cluster` in `ns`.
    pub fn wrote(&self, ns: &str, cluster: &str, write: Write) {
        let mut w = self.writes.lock().unwrap();
        let list = w.entry((ns.to_string(), cluster.to_string())).or_default();
        list.retain(|x| !(x.kind == write.kind && x.name == write.name));
        list.push(write);
    }

    /// The object's resourceVersion and uid as cached (`None`: absent); a Secret the clusters
    /// do not own, by its metadata.
    fn cached_meta(&self, kind: Kind, ns: &str, name: &str) -> Option<(String, Option<String>)> {
        self.objects.meta(kind, ns, name).or_else(|| match kind {
            Kind::Secret => find(&self.secret_meta, ns, name),
            _ => None,
        })
    }

    /// Whether the caches show every write the cluster's passes made (forgetting those they
    /// show).
    pub fn show_writes(&self, ns: &str, cluster: &str) -> bool {
        let key = (ns.to_string(), cluster.to_string());
        let pending = self.writes.lock().unwrap().get(&key).cloned();
        let Some(pending) = pending else {
            return true;
        };
        let shown: Vec<Write> = pending
            .into_iter()
            .filter(|w| w.shown_by(self.cached_meta(w.kind, ns, &w.name).as_ref()))
            .collect();
        let mut all = self.writes.lock().unwrap();
        // a write made meanwhile replaced its entry and stays
        let Some(list) = all.get_mut(&key) else {
            return true;
        };
        list.retain(|w| !shown.contains(w));
        if list.is_empty() {
            all.remove(&key);
            return true;
        }
        false
    }

    /// Waits up to `budget` for the caches to show every write the cluster's passes made. When
    /// they do not by then, the writes are forgotten and the cluster is observed from the API
    /// server until the caches hold what it says (see the module's documentation).
    pub async fn await_writes(&self, ns: &str, cluster: &str, budget: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + budget;
        loop {
            if self.show_writes(ns, cluster) {
                return true;
            }
            if std::time::Instant::now() >= deadline {
                self.writes
                    .lock()
                    .unwrap()
                    .remove(&(ns.to_string(), cluster.to_string()));
                self.set_dirty(ns, cluster, true);
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// The stamps of everything a pass of cluster `name` in `ns` reads from the caches: its
    /// objects of every kind, its backups, and the Secrets of its namespace (decision 60).
    /// Equal stamps taken at two times mean that the caches showed it nothing new in between.
    /// `None` while the caches are not to be planned from (not filled yet, or the cluster is
    /// observed from the API server).
    pub fn stamps(&self, ns: &str, name: &str) -> Option<Vec<Option<u64>>> {
        if !self.synced() || self.dirty(ns, name) || !self.show_writes(ns, name) {
            return None;
        }
        let mut out = Vec::new();
        self.objects.stamps(ns, name, &mut out);
        out.extend(self.backups.iter().map(|i| i.stamp(ns, name)));
        out.extend(self.secret_meta.iter().map(|i| i.namespace_stamp(ns)));
        Some(out)
    }

    /// Forgets what is kept of a deleted cluster.
    pub fn forget(&self, ns: &str, name: &str) {
        self.set_dirty(ns, name, false);
        self.writes
            .lock()
            .unwrap()
            .remove(&(ns.to_string(), name.to_string()));
    }

    /// Objects in the caches, by kind (for the operator's own metrics and the benchmark).
    pub fn sizes(&self) -> Vec<(&'static str, usize)> {
        let mut sizes = self.objects.sizes();
        sizes.push(("SecretMetadata", count(&self.secret_meta)));
        sizes.push(("ClickHouseBackup", count(&self.backups)));
        sizes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ConfigMap, Pod};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
    use kube::api::ObjectMeta;

    fn cm(ns: &str, name: &str, cluster: Option<&str>, rv: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                resource_version: Some(rv.into()),
                labels: cluster.map(|c| [(labels::CLUSTER.to_string(), c.to_string())].into()),
                managed_fields: Some(vec![
                    ManagedFieldsEntry {
                        manager: Some(crate::model::diff::FIELD_MANAGER.into()),
                        ..Default::default()
                    },
                    ManagedFieldsEntry {
                        manager: Some("kube-controller-manager".into()),
                        subresource: Some("status".into()),
                        ..Default::default()
                    },
                ]),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    fn names(v: Vec<ConfigMap>) -> Vec<String> {
        v.into_iter().map(|o| o.name_any()).collect()
    }

    /// Decision 60: a cluster's stamp changes with each change of its objects (added, changed,
    /// relabelled away, deleted, relisted) and with nothing else; a namespace's with any of its
    /// objects, unlabelled ones included.
    #[test]
    fn stamps_change_with_a_clusters_objects_and_nothing_else() {
        let i = Index::<ConfigMap>::new(cluster_label);
        i.apply(&Event::Init);
        i.apply(&Event::InitApply(cm("a", "c1-x", Some("c1"), "1")));
        i.apply(&Event::InitApply(cm("a", "c2-x", Some("c2"), "2")));
        i.apply(&Event::InitDone);
        let c1 = i.stamp("a", "c1");
        let ns_a = i.namespace_stamp("a");
        assert!(c1.is_some() && ns_a.is_some());
        assert_eq!(i.stamp("a", "c3"), None);
        assert_eq!(i.stamp("b", "c1"), None);
        // another cluster's change leaves c1's stamp
        i.apply(&Event::Apply(cm("a", "c2-x", Some("c2"), "3")));
        assert_eq!(i.stamp("a", "c1"), c1);
        assert_ne!(i.namespace_stamp("a"), ns_a);
        // another namespace's leaves this namespace's
        let ns_a = i.namespace_stamp("a");
        i.apply(&Event::Apply(cm("b", "c1-x", Some("c1"), "4")));
        assert_eq!(i.namespace_stamp("a"), ns_a);
        assert_eq!(i.stamp("a", "c1"), c1);
        // each change of c1's objects gives a stamp never seen before
        let mut seen = vec![c1];
        let mut changed = |i: &Index<ConfigMap>, what: &str| {
            let now = i.stamp("a", "c1");
            assert!(
                !seen.contains(&now),
                "{what}: {now:?} seen before ({seen:?})"
            );
            seen.push(now);
        };
        i.apply(&Event::Apply(cm("a", "c1-x", Some("c1"), "5")));
        changed(&i, "changed");
        i.apply(&Event::Apply(cm("a", "c1-y", Some("c1"), "6")));
        changed(&i, "added");
        i.apply(&Event::Apply(cm("a", "c1-y", Some("c2"), "7")));
        changed(&i, "relabelled away");
        i.apply(&Event::Delete(cm("a", "c1-x", Some("c1"), "8")));
        assert_eq!(i.stamp("a", "c1"), None, "no objects left");
        i.apply(&Event::Apply(cm("a", "c1-x", Some("c1"), "9")));
        changed(&i, "back");
        i.apply(&Event::Init);
        i.apply(&Event::InitApply(cm("a", "c1-x", Some("c1"), "9")));
        i.apply(&Event::InitDone);
        changed(&i, "relisted");
        // an unlabelled object changes its namespace's stamp only
        let c1 = i.stamp("a", "c1");
        let ns_a = i.namespace_stamp("a");
        i.apply(&Event::Apply(cm("a", "other", None, "10")));
        assert_eq!(i.stamp("a", "c1"), c1);
        assert_ne!(i.namespace_stamp("a"), ns_a);
    }

    /// Decision 41: the index follows the watch (a relist replaces everything at once, an object
    /// that changes cluster or is deleted leaves its old group), finds a cluster's objects
    /// without the others, and keeps no managed fields but other writers'.
    #[test]
    fn the_index_follows_the_watch_by_namespace_and_cluster() {
        let i = Index::<ConfigMap>::new(cluster_label);
        assert!(!i.synced());
        i.apply(&Event::Init);
        i.apply(&Event::InitApply(cm("a", "c1-x", Some("c1"), "1")));
        i.apply(&Event::InitApply(cm("a", "c2-x", Some("c2"), "2")));
        i.apply(&Event::InitApply(cm("b", "c1-x", Some("c1"), "3")));
        assert!(i.group("a", "c1").is_empty(), "nothing before InitDone");
        i.apply(&Event::InitDone);
        assert!(i.synced());
        assert_eq!(names(i.group("a", "c1")), ["c1-x"]);
        assert_eq!(names(i.group("b", "c1")), ["c1-x"]);
        assert!(i.group("a", "c1")[0].metadata.managed_fields.is_none());
        // another writer's entry stays: a hand edit the next pass repairs (decision 30)
        let mut edited = cm("a", "c1-z", Some("c1"), "5");
        edited
            .metadata
            .managed_fields
            .as_mut()
            .unwrap()
            .push(ManagedFieldsEntry {
                manager: Some("kubectl-edit".into()),
                ..Default::default()
            });
        i.apply(&Event::Apply(edited));
        let kept = i.group("a", "c1");
        let kept = kept.iter().find(|o| o.name_any() == "c1-z").unwrap();
        assert_eq!(
            kept.metadata.managed_fields.as_ref().unwrap()[0]
                .manager
                .as_deref(),
            Some("kubectl-edit")
        );
        assert_eq!(kept.metadata.managed_fields.as_ref().unwrap().len(), 1);
        i.apply(&Event::Delete(cm("a", "c1-z", Some("c1"), "6")));
        i.apply(&Event::Apply(cm("a", "c1-y", Some("c1"), "4")));
        assert_eq!(names(i.group("a", "c1")), ["c1-x", "c1-y"]);
        // relabelled to another cluster: leaves c1
        i.apply(&Event::Apply(cm("a", "c1-y", Some("c2"), "5")));
        assert_eq!(names(i.group("a", "c1")), ["c1-x"]);
        assert_eq!(names(i.group("a", "c2")), ["c1-y", "c2-x"]);
        i.apply(&Event::Delete(cm("a", "c2-x", Some("c2"), "6")));
        assert_eq!(names(i.group("a", "c2")), ["c1-y"]);
        // unlabelled objects are found by name only
        i.apply(&Event::Apply(cm("a", "other", None, "7")));
        assert!(i.get("a", "other").is_some());
        assert_eq!(i.len(), 4);
        // a relist drops what is gone
        i.apply(&Event::Init);
        i.apply(&Event::InitApply(cm("a", "c1-x", Some("c1"), "8")));
        i.apply(&Event::InitDone);
        assert_eq!(i.len(), 1);
        assert!(i.group("a", "c2").is_empty());
        assert_eq!(
            i.get("a", "c1-x").unwrap().resource_version().as_deref(),
            Some("8")
        );
    }

    fn pod(name: &str, uid: &str, version: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.namespace = Some("a".into());
        p.metadata.name = Some(name.into());
        p.metadata.uid = Some(uid.into());
        p.metadata.resource_version = Some(version.into());
        p.metadata.labels = Some([(labels::CLUSTER.to_string(), "c1".to_string())].into());
        p
    }

    /// Decision 41: a pass plans from the caches only once they show the writes of the passes
    /// before: an object at the version written or a later one, a deleted object gone or
    /// replaced by another uid; the latest write to an object is the one awaited.
    #[tokio::test]
    async fn the_caches_are_used_once_they_show_the_passes_own_writes() {
        let mut c = Caches::default();
        let pods = Index::new(cluster_label::<Pod>);
        c.objects.pods.push(pods.clone());
        pods.apply(&Event::Apply(pod("p0", "u0", "4")));
        assert!(c.show_writes("a", "c1"), "nothing written");
        c.wrote("a", "c1", Write::of(Kind::Pod, &pod("p0", "u0", "5")));
        assert!(!c.show_writes("a", "c1"), "the cache has version 4 only");
        pods.apply(&Event::Apply(pod("p0", "u0", "6")));
        assert!(c.show_writes("a", "c1"), "a later version shows the write");
        // a deletion: shown once the pod is gone or another one has its name
        c.wrote(
            "a",
            "c1",
            Write {
                kind: Kind::Pod,
                name: "p0".into(),
                seen: Seen::Gone {
                    uid: Some("u0".into()),
                    version: Some("7".into()),
                },
            },
        );
        assert!(!c.show_writes("a", "c1"));
        pods.apply(&Event::Apply(pod("p0", "u1", "3")));
        assert!(c.show_writes("a", "c1"), "another uid under the name");
        // a write to an object never cached: waited for, then the API server is read
        c.wrote(
            "a",
            "c1",
            Write::of(Kind::StatefulSet, &pod("s0", "u2", "9")),
        );
        assert!(!c.show_writes("a", "c1"));
        assert!(
            !c.await_writes("a", "c1", std::time::Duration::from_millis(30))
                .await
        );
        assert!(
            c.dirty("a", "c1"),
            "observed from the API server until caught up"
        );
        assert!(c.show_writes("a", "c1"), "the writes were forgotten");
        // the latest write to an object replaces the one before
        c.wrote("a", "c1", Write::of(Kind::Pod, &pod("p0", "u1", "12")));
        c.wrote("a", "c1", Write::of(Kind::Pod, &pod("p0", "u1", "3")));
        assert!(c.show_writes("a", "c1"));
    }

    #[test]
    fn a_referenced_secret_is_read_again_only_at_a_new_version() {
        let c = Caches::default();
        let mut s = Secret::default();
        s.metadata.namespace = Some("a".into());
        s.metadata.name = Some("users".into());
        s.metadata.resource_version = Some("10".into());
        c.remember_secret(&s);
        assert!(c.secret_at("a", "users", "10").is_some());
        assert!(c.secret_at("a", "users", "11").is_none());
        assert!(c.secret_at("b", "users", "10").is_none());
        assert!(!c.dirty("a", "c1"));
        c.set_dirty("a", "c1", true);
        assert!(c.dirty("a", "c1"));
        c.forget("a", "c1");
        assert!(!c.dirty("a", "c1"));
        assert!(!c.synced(), "no watch yet");
    }
}
