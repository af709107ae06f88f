//! The operator-wide bounds of a cluster's size (review M-2, decision 68), read by the
//! runtime settings and enforced by the API's validation.

/// The most shards any installation may allow: the CRD's own maximum of `spec.shards`, which
/// `MAX_SHARDS` cannot raise (review M-2, decision 68).
pub const SHARDS_CEILING: i32 = 1024;
/// The most replicas per shard any installation may allow: the CRD's maximum of
/// `spec.replicas`, which `MAX_REPLICAS` cannot raise.
pub const REPLICAS_CEILING: i32 = 32;
/// The most members `spec.keeper.external.nodes` may list (the CRD's `maxItems`).
pub const EXTERNAL_KEEPER_NODES_CEILING: u64 = 16;

/// The operator-wide bounds of a cluster's size (`MAX_SHARDS`, `MAX_REPLICAS`; decision 68):
/// a spec above them is refused with the field and the setting named, before anything is
/// planned, so one spec cannot make a pass build millions of replicas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_shards: i32,
    pub max_replicas: i32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_shards: 256,
            max_replicas: 16,
        }
    }
}

impl Limits {
    /// Reads `MAX_SHARDS` and `MAX_REPLICAS` through `get`: unset or empty keeps the default,
    /// anything else must be a number from 1 up to the CRD's ceiling.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Limits, String> {
        let d = Limits::default();
        let read = |name: &str, default: i32, ceiling: i32| -> Result<i32, String> {
            match get(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
            {
                None => Ok(default),
                Some(v) => match v.parse::<i32>() {
                    Ok(n) if (1..=ceiling).contains(&n) => Ok(n),
                    _ => Err(format!(
                        "{name}: {v:?} must be a number from 1 to {ceiling} (the CRD's maximum)"
                    )),
                },
            }
        };
        Ok(Limits {
            max_shards: read("MAX_SHARDS", d.max_shards, SHARDS_CEILING)?,
            max_replicas: read("MAX_REPLICAS", d.max_replicas, REPLICAS_CEILING)?,
        })
    }
}
