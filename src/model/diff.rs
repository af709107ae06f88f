//! PURE: does an object on the server already hold what we would write? The API server adds
//! defaults and status, so "equal" is too strict: the observed object *covers* the desired one
//! when every field we set has the same value there. A pass writes only objects that are not
//! covered, so a pass in which nothing changed sends no write, and a hand edit of a field we
//! own is noticed and reverted.

use serde_json::Value;

/// Does `observed` hold every field of `desired` with the same value?
pub fn covers(observed: &Value, desired: &Value) -> bool {
    match (observed, desired) {
        (_, Value::Null) => true,
        (Value::Object(o), Value::Object(d)) => d.iter().all(|(k, dv)| match o.get(k) {
            Some(ov) => covers(ov, dv),
            None => is_empty(dv),
        }),
        (Value::Null, d) => is_empty(d),
        (Value::Array(o), Value::Array(d)) => {
            o.len() == d.len() && o.iter().zip(d).all(|(ov, dv)| covers(ov, dv))
        }
        (o, d) => o == d || same_number(o, d),
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(m) => m.values().all(is_empty),
        Value::Array(a) => a.is_empty(),
        Value::Bool(b) => !b,
        _ => false,
    }
}

fn same_number(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => false,
    }
}

/// Does the observed object cover the desired one, looking only at what an apply writes:
/// labels, annotations and owner references, and everything outside `metadata` and `status`?
pub fn object_covered(observed: &Value, desired: &Value) -> bool {
    let Some(d) = desired.as_object() else {
        return false;
    };
    d.iter().all(|(k, dv)| match k.as_str() {
        "status" | "apiVersion" | "kind" => true,
        "metadata" => ["labels", "annotations", "ownerReferences"]
            .iter()
            .all(|f| covers(&observed["metadata"][*f], &dv[*f])),
        _ => covers(&observed[k], dv),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn server_defaults_do_not_count_as_differences() {
        let desired = json!({"spec": {"replicas": 1, "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}});
        let observed = json!({"spec": {"replicas": 1, "revisionHistoryLimit": 10,
            "template": {"spec": {"dnsPolicy": "ClusterFirst", "containers": [{"name": "c", "image": "i", "imagePullPolicy": "IfNotPresent"}]}}},
            "status": {"replicas": 1}});
        assert!(object_covered(&observed, &desired));
    }

    #[test]
    fn changed_or_missing_fields_are_differences() {
        let desired = json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "new"}]}}}});
        let observed = json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "old"}]}}}});
        assert!(!object_covered(&observed, &desired));
        // An extra element (a sidecar added) or a removed one is a difference.
        let two = json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "new"}, {"name": "s"}]}}}});
        assert!(!object_covered(&two, &desired));
        assert!(!object_covered(&json!({}), &json!({"data": {"a": "1"}})));
        assert!(!object_covered(
            &json!({"metadata": {"labels": {"a": "1"}}}),
            &json!({"metadata": {"labels": {"a": "2"}}})
        ));
    }

    #[test]
    fn empty_desired_values_match_absent_ones() {
        assert!(object_covered(
            &json!({"spec": {}}),
            &json!({"spec": {"tolerations": [], "nodeSelector": {}, "hostNetwork": false}})
        ));
        assert!(covers(&json!(1), &json!(1.0)));
        // Metadata other than labels, annotations and owners is the server's.
        assert!(object_covered(
            &json!({"metadata": {"resourceVersion": "9", "labels": {"a": "1", "b": "2"}}}),
            &json!({"metadata": {"name": "x", "labels": {"a": "1"}}})
        ));
    }
}
