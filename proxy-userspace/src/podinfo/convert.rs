//! Model pods → podinfo.v1alpha1 messages.

use proto::podinfo::v1alpha1 as pb;

use crate::model::{ConditionStatus, Pod, PodCondition, Timestamp};

fn timestamp(t: Timestamp) -> pbjson_types::Timestamp {
    let Timestamp { seconds, nanos } = t;
    pbjson_types::Timestamp { seconds, nanos }
}

fn status(s: ConditionStatus) -> pb::ConditionStatus {
    match s {
        ConditionStatus::True => pb::ConditionStatus::True,
        ConditionStatus::False => pb::ConditionStatus::False,
        ConditionStatus::Unknown => pb::ConditionStatus::Unknown,
    }
}

fn condition(c: &PodCondition) -> pb::PodCondition {
    let PodCondition {
        condition_type,
        status: s,
        last_probe_time,
        last_transition_time,
        reason,
        message,
    } = c;
    pb::PodCondition {
        r#type: condition_type.clone(),
        status: status(*s).into(),
        last_probe_time: last_probe_time.map(timestamp),
        last_transition_time: last_transition_time.map(timestamp),
        reason: reason.clone(),
        message: message.clone(),
    }
}

pub fn pod_info(p: &Pod) -> pb::PodInfo {
    // node_name is this node for every pod published to PodInfo.
    let Pod {
        key,
        uid,
        node_name: _,
        static_pod,
        conditions,
        deletion_timestamp,
    } = p;
    pb::PodInfo {
        pod_uid: uid.clone(),
        pod_namespace: key.namespace.to_string(),
        pod_name: key.name.to_string(),
        static_pod: *static_pod,
        conditions: conditions.iter().map(condition).collect(),
        deletion_timestamp: deletion_timestamp.map(timestamp),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ObjectKey;

    #[test]
    fn every_field_is_carried_and_conditions_keep_their_order() {
        let cond = |t: &str, s| PodCondition {
            condition_type: t.to_owned(),
            status: s,
            last_probe_time: None,
            last_transition_time: Some(Timestamp {
                seconds: 1_700_000_000,
                nanos: 5,
            }),
            reason: "R".to_owned(),
            message: "M".to_owned(),
        };
        let p = Pod {
            key: ObjectKey::new("kube-system", "etcd-n1"),
            uid: "u1".to_owned(),
            node_name: Some("n1".to_owned()),
            static_pod: true,
            conditions: vec![
                cond("Ready", ConditionStatus::False),
                cond("example.com/gate", ConditionStatus::Unknown),
                cond("PodScheduled", ConditionStatus::True),
            ],
            deletion_timestamp: Some(Timestamp {
                seconds: 1_700_000_100,
                nanos: 0,
            }),
        };
        let info = pod_info(&p);
        assert_eq!(
            (
                info.pod_uid.as_str(),
                info.pod_namespace.as_str(),
                info.pod_name.as_str(),
                info.static_pod
            ),
            ("u1", "kube-system", "etcd-n1", true)
        );
        let types: Vec<(&str, pb::ConditionStatus)> = info
            .conditions
            .iter()
            .map(|c| (c.r#type.as_str(), c.status()))
            .collect();
        assert_eq!(
            types,
            [
                ("Ready", pb::ConditionStatus::False),
                ("example.com/gate", pb::ConditionStatus::Unknown),
                ("PodScheduled", pb::ConditionStatus::True)
            ]
        );
        assert_eq!(info.conditions[0].last_probe_time, None);
        assert_eq!(
            info.conditions[0].last_transition_time,
            Some(pbjson_types::Timestamp {
                seconds: 1_700_000_000,
                nanos: 5
            })
        );
        assert_eq!(
            (
                info.conditions[0].reason.as_str(),
                info.conditions[0].message.as_str()
            ),
            ("R", "M")
        );
        assert_eq!(
            info.deletion_timestamp.map(|t| t.seconds),
            Some(1_700_000_100)
        );
    }
}
