//! The schema's table against the architectures, and each row's bound refusing what lies past it.
use super::schema::{key, Bound, Dflt, Ty, Val, When, KEYS};
use super::COMMON_REQUIRED;

/// A key an architecture requires is a row that says the architecture reads it.
#[test]
fn every_required_key_is_a_row_of_its_architecture() {
    for a in crate::arch::ARCHS {
        let name = a.spec.name;
        for k in COMMON_REQUIRED.iter().chain(a.spec.required_keys) {
            let row = key(k).unwrap_or_else(|| panic!("{name} requires {k}, not in the schema"));
            assert!(
                row.applies_to(name),
                "{name} requires {k}, whose row omits it"
            );
        }
        for row in KEYS {
            for arch in row.archs {
                assert!(
                    crate::arch::by_name(arch).is_some(),
                    "row {} names architecture {arch:?}, not in ARCHS",
                    row.name
                );
            }
        }
    }
}

/// Names are unique, and a default that names another row names an earlier one of its type
/// (`from_meta` reads the rows in order).
#[test]
fn defaults_name_earlier_rows_of_the_same_type() {
    for (i, row) in KEYS.iter().enumerate() {
        assert_eq!(
            KEYS.iter().filter(|r| r.name == row.name).count(),
            1,
            "{} is listed twice",
            row.name
        );
        if let Dflt::Same(other) = row.default {
            let j = KEYS.iter().position(|r| r.name == other);
            assert!(
                j.is_some_and(|j| j < i),
                "{}: {other} is not an earlier row",
                row.name
            );
            assert_eq!(
                KEYS[j.unwrap()].ty,
                row.ty,
                "{}: {other} has another type",
                row.name
            );
        }
    }
}

/// Values just past a row's bound (one more than its largest, one less than its smallest; a
/// negative, infinite or NaN number), each set alone on every built architecture's tiny preset
/// that reads the key, are refused by `validate` naming the key.
#[test]
fn each_bound_refuses_what_lies_past_it_naming_the_key() {
    let mut checked = 0;
    for a in crate::arch::built() {
        let base = (a
            .synth
            .tiny
            .expect("a built architecture has a tiny preset"))();
        base.validate().unwrap();
        for row in KEYS.iter().filter(|r| r.applies_to(a.spec.name)) {
            if row.when == When::WithExperts && base.n_expert == 0 {
                continue;
            }
            let bad: Vec<Val> = match row.bound {
                Bound::Free => continue,
                Bound::Int(lo, hi, _) => [lo.checked_sub(1), hi.checked_add(1)]
                    .into_iter()
                    .flatten()
                    .map(Val::U)
                    .collect(),
                Bound::ZeroOr(_, hi) => vec![Val::U(hi + 1)],
                Bound::NonNeg(_) | Bound::Base { .. } => {
                    [-1.0, f32::NAN, f32::INFINITY].map(Val::F).to_vec()
                }
                Bound::Finite => [f32::NAN, f32::INFINITY].map(Val::F).to_vec(),
                Bound::Epsilon => [0.0, 1.5, f32::NAN].map(Val::F).to_vec(),
            };
            assert_ne!(row.ty, Ty::Custom, "{}: a bound on a custom row", row.name);
            for v in bad {
                let mut h = base.clone();
                (row.set)(&mut h, v.clone());
                let e = h
                    .validate()
                    .expect_err(&format!("{} = {v} accepted", row.full(&h)));
                assert!(
                    e.starts_with(&format!("{} = {v}: must", row.full(&h))),
                    "{} = {v}: {e}",
                    row.full(&h)
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 100, "only {checked} cases");
}

/// `inspect` lists the rows the file's architecture reads, and no other.
#[test]
fn the_listing_holds_the_rows_of_the_architecture() {
    let q = (crate::arch::qwen3moe::QWEN3MOE.synth.tiny.unwrap())();
    let l = super::schema::listing(&q);
    let get = |k: &str| l.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string());
    assert_eq!(get("expert_count"), Some(q.n_expert.to_string()));
    assert_eq!(get("expert_gating_func"), Some("Softmax".into()));
    assert_eq!(get("hyper_connection.count"), None);
    let d = (crate::arch::deepseek4::DEEPSEEK4.synth.tiny.unwrap())();
    let l = super::schema::listing(&d);
    assert!(l
        .iter()
        .any(|(n, v)| *n == "hyper_connection.count" && *v == Val::U(4)));
}
