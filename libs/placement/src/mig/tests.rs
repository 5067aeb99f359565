use super::*;

/// NVIDIA's profile table: per model, each profile and how many instances
/// of it alone fit on one GPU. `+me` profiles are NVIDIA's, one each.
const PROFILE_COUNTS: &[(&str, &[(&str, u8)])] = &[
    (
        "A100-40GB",
        &[
            ("1g.5gb", 7),
            ("2g.10gb", 3),
            ("3g.20gb", 2),
            ("4g.20gb", 1),
            ("7g.40gb", 1),
        ],
    ),
    (
        "A100-80GB",
        &[
            ("1g.10gb", 7),
            ("2g.20gb", 3),
            ("3g.40gb", 2),
            ("4g.40gb", 1),
            ("7g.80gb", 1),
        ],
    ),
    (
        "H100-80GB",
        &[
            ("1g.10gb", 7),
            ("2g.20gb", 3),
            ("3g.40gb", 2),
            ("4g.40gb", 1),
            ("7g.80gb", 1),
            ("1g.20gb", 4),
        ],
    ),
    (
        "H200-141GB",
        &[
            ("1g.18gb", 7),
            ("1g.35gb", 4),
            ("2g.35gb", 3),
            ("3g.71gb", 2),
            ("4g.71gb", 1),
            ("7g.141gb", 1),
        ],
    ),
    ("A30-24GB", &[("1g.6gb", 4), ("2g.12gb", 2), ("4g.24gb", 1)]),
];

fn held(g: &'static Geometry, name: &str, start: u8, lease: u32) -> Instance<u32> {
    Instance {
        profile: g
            .profile(name)
            .unwrap_or_else(|| panic!("{} has {name}", g.model)),
        start,
        lease: Some(lease),
        persistent: false,
        unowned: false,
    }
}

fn layout_of(model: &str, parts: &[(&str, u8)]) -> Result<MigLayout<u32>, MigError> {
    let g = geometry(model).unwrap();
    let instances = parts
        .iter()
        .zip(0u32..)
        .map(|(&(name, start), lease)| held(g, name, start, lease))
        .collect();
    MigLayout::from_instances(g, instances)
}

/// Most instances of `p` alone, by trying every subset of its starts
/// against `validate` (independent of the placer's greedy count).
fn brute_force_max(g: &'static Geometry, p: &'static MigProfile) -> u8 {
    let n = p.starts.len();
    (0u32..1 << n)
        .filter_map(|bits| {
            let inst: Vec<_> = (0..n)
                .filter(|i| bits & (1 << i) != 0)
                .map(|i| Instance {
                    profile: p,
                    start: p.starts[i],
                    lease: Some(i as u32),
                    persistent: false,
                    unowned: false,
                })
                .collect();
            MigLayout::from_instances(g, inst)
                .ok()
                .map(|l| l.instances().len() as u8)
        })
        .max()
        .unwrap()
}

#[test]
fn models_have_exactly_the_nvidia_profiles_plus_media_variants() {
    assert_eq!(geometries().len(), PROFILE_COUNTS.len());
    for &(model, expected) in PROFILE_COUNTS {
        let g = geometry(model).unwrap();
        let mut plain: Vec<_> = g
            .profiles
            .iter()
            .filter(|p| !p.media_extensions)
            .map(|p| p.name)
            .collect();
        let mut want: Vec<_> = expected.iter().map(|(n, _)| *n).collect();
        plain.sort_unstable();
        want.sort_unstable();
        assert_eq!(plain, want, "{model}");
        for me in g.profiles.iter().filter(|p| p.media_extensions) {
            let base = me.name.strip_suffix("+me").unwrap();
            let base = g.profile(base).unwrap();
            assert_eq!(
                (
                    base.compute_slices,
                    base.memory_gb,
                    base.memory_slices,
                    base.starts
                ),
                (me.compute_slices, me.memory_gb, me.memory_slices, me.starts),
                "{model} {}",
                me.name
            );
        }
    }
}

#[test]
fn profile_counts_follow_from_the_offsets() {
    for &(model, expected) in PROFILE_COUNTS {
        let g = geometry(model).unwrap();
        let mut all: Vec<(&str, u8)> = expected.to_vec();
        all.extend(
            g.profiles
                .iter()
                .filter(|p| p.media_extensions)
                .map(|p| (p.name, 1)),
        );
        let empty = MigLayout::<u32>::empty(g);
        let counts = placeable_counts(&empty);
        for (name, count) in all {
            let p = g.profile(name).unwrap();
            assert_eq!(p.max_instances, count, "{model} {name} table");
            assert_eq!(brute_force_max(g, p), count, "{model} {name} brute force");
            let c = counts.iter().find(|(q, _)| q.name == name).unwrap().1;
            assert_eq!(c, count, "{model} {name} placeable_counts");
            let mut l = empty.clone();
            let mut placed = 0u8;
            while place(&mut l, name, u32::from(placed)).is_ok() {
                placed += 1;
                assert!(placed <= 8);
            }
            assert_eq!(placed, count, "{model} {name} successive place");
            assert!(placeable_counts(&l)
                .iter()
                .all(|(q, n)| *n == 0 || q.name != name));
        }
    }
}

#[test]
fn tables_respect_the_slice_rules() {
    for g in geometries() {
        let (c, m) = (g.compute_slices, g.memory_slices);
        match g.model {
            "A30-24GB" => assert_eq!((c, m), (4, 4)),
            _ => assert_eq!((c, m), (7, 8), "{}", g.model),
        }
        assert!(g.profiles.len() <= MAX_PROFILES);
        let mut names: Vec<_> = g.profiles.iter().map(|p| p.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), g.profiles.len(), "{} duplicate names", g.model);
        let full = g
            .profiles
            .iter()
            .find(|p| p.compute_slices == c)
            .expect("a whole-GPU profile");
        assert_eq!(
            (full.memory_slices, full.memory_gb, full.starts),
            (m, g.memory_gb, &[0u8][..])
        );
        for p in g.profiles {
            let what = format!("{} {}", g.model, p.name);
            let suffix = if p.media_extensions { "+me" } else { "" };
            assert_eq!(
                p.name,
                format!("{}g.{}gb{suffix}", p.compute_slices, p.memory_gb),
                "{what}"
            );
            // Memory in the name is the GPU's memory times the span's
            // fraction of the memory slices, rounded (within 1 GB).
            let exact = u32::from(p.memory_slices) * g.memory_gb;
            let named = p.memory_gb * u32::from(m);
            assert!(
                named.abs_diff(exact) <= u32::from(m),
                "{what} memory {named} vs {exact}"
            );
            assert!(
                p.compute_slices >= 1 && p.compute_slices <= p.memory_slices,
                "{what}"
            );
            assert!(
                !p.starts.is_empty() && p.starts.windows(2).all(|w| w[0] < w[1]),
                "{what}"
            );
            for &s in p.starts {
                assert!(s + p.memory_slices <= m, "{what} at {s} past memory slices");
                assert!(
                    s + p.compute_slices <= c,
                    "{what} at {s} past compute slices"
                );
                assert_eq!(
                    s % p.memory_slices,
                    0,
                    "{what} at {s} not aligned to its span"
                );
            }
        }
    }
}

#[test]
fn nvidia_combinations_are_valid() {
    let ok: &[(&str, &[(&str, u8)])] = &[
        ("A100-40GB", &[("7g.40gb", 0)]),
        ("A100-40GB", &[("4g.20gb", 0), ("3g.20gb", 4)]),
        (
            "A100-40GB",
            &[("4g.20gb", 0), ("2g.10gb", 4), ("1g.5gb", 6)],
        ),
        (
            "A100-40GB",
            &[("4g.20gb", 0), ("1g.5gb", 4), ("1g.5gb", 5), ("1g.5gb", 6)],
        ),
        ("A100-40GB", &[("3g.20gb", 0), ("3g.20gb", 4)]),
        (
            "A100-40GB",
            &[("3g.20gb", 0), ("2g.10gb", 4), ("1g.5gb+me", 6)],
        ),
        (
            "A100-40GB",
            &[("2g.10gb", 0), ("2g.10gb", 2), ("3g.20gb", 4)],
        ),
        (
            "A100-40GB",
            &[
                ("2g.10gb", 0),
                ("2g.10gb", 2),
                ("2g.10gb", 4),
                ("1g.5gb", 6),
            ],
        ),
        (
            "A100-40GB",
            &[("1g.5gb", 0), ("1g.5gb", 1), ("2g.10gb", 2), ("3g.20gb", 4)],
        ),
        (
            "A100-80GB",
            &[
                ("1g.10gb", 0),
                ("1g.10gb", 1),
                ("1g.10gb", 2),
                ("1g.10gb", 3),
                ("1g.10gb", 4),
                ("1g.10gb", 5),
                ("1g.10gb", 6),
            ],
        ),
        (
            "H100-80GB",
            &[
                ("1g.20gb", 0),
                ("1g.20gb", 2),
                ("1g.20gb", 4),
                ("1g.20gb", 6),
            ],
        ),
        (
            "H100-80GB",
            &[("3g.40gb", 0), ("2g.20gb", 4), ("1g.20gb", 6)],
        ),
        (
            "H200-141GB",
            &[("4g.71gb", 0), ("1g.35gb", 4), ("1g.18gb+me", 6)],
        ),
        ("A30-24GB", &[("2g.12gb", 0), ("1g.6gb", 2), ("1g.6gb", 3)]),
        (
            "A30-24GB",
            &[("1g.6gb+me", 0), ("1g.6gb", 1), ("2g.12gb", 2)],
        ),
    ];
    for (model, parts) in ok {
        let l = layout_of(model, parts).unwrap_or_else(|e| panic!("{model} {parts:?}: {e}"));
        let compute: u8 = l.instances().iter().map(|i| i.profile.compute_slices).sum();
        assert!(compute <= l.geometry().compute_slices);
    }
}

#[test]
fn rule_breaking_layouts_are_rejected() {
    let bad: &[(&str, &[(&str, u8)])] = &[
        ("A100-40GB", &[("4g.20gb", 0), ("3g.20gb", 0)]),
        // 3g at 0 spans memory slices 0..4: its 4th compute slice is lost.
        ("A100-40GB", &[("3g.20gb", 0), ("1g.5gb", 3)]),
        ("A100-40GB", &[("4g.20gb", 0), ("4g.20gb", 0)]),
        ("A100-40GB", &[("7g.40gb", 0), ("1g.5gb", 6)]),
        ("A100-40GB", &[("1g.5gb+me", 0), ("1g.5gb+me", 1)]),
        ("H100-80GB", &[("1g.20gb", 0), ("1g.10gb", 1)]),
        ("H100-80GB", &[("3g.40gb", 4), ("1g.20gb", 6)]),
        ("A30-24GB", &[("1g.6gb+me", 0), ("2g.12gb+me", 2)]),
        ("A30-24GB", &[("4g.24gb", 0), ("1g.6gb", 3)]),
    ];
    for (model, parts) in bad {
        assert!(
            layout_of(model, parts).is_err(),
            "{model} {parts:?} accepted"
        );
    }
    let g = geometry("A100-40GB").unwrap();
    let p = g.profile("1g.5gb").unwrap();
    let at = |start: u8, lease: Option<u32>, persistent: bool| Instance {
        profile: p,
        start,
        lease,
        persistent,
        unowned: false,
    };
    // Not an allowed start: 1g may not sit on memory slice 7.
    assert!(MigLayout::from_instances(g, vec![at(7, Some(1), false)]).is_err());
    assert!(
        MigLayout::from_instances(g, vec![at(1, Some(1), false), at(2, Some(1), false)]).is_err()
    );
    assert!(MigLayout::from_instances(g, vec![at(1, None, false)]).is_err());
    let other = geometry("H100-80GB").unwrap().profile("1g.20gb").unwrap();
    let foreign = Instance::<u32> {
        profile: other,
        start: 0,
        lease: None,
        persistent: true,
        unowned: false,
    };
    assert!(MigLayout::from_instances(g, vec![foreign]).is_err());
    // An unowned instance is no lease's.
    let claimed = Instance {
        unowned: true,
        ..at(0, Some(1), true)
    };
    assert!(MigLayout::from_instances(g, vec![claimed]).is_err());
}

#[test]
fn offsets_keep_the_largest_profiles_possible() {
    let cases: &[(&str, &str, u8)] = &[
        ("A100-40GB", "1g.5gb", 6),
        ("A100-40GB", "2g.10gb", 4),
        ("A100-40GB", "3g.20gb", 4),
        ("A100-40GB", "4g.20gb", 0),
        ("A100-40GB", "7g.40gb", 0),
        ("H100-80GB", "1g.20gb", 6),
        ("H200-141GB", "1g.35gb", 6),
        ("A30-24GB", "1g.6gb", 0),
        ("A30-24GB", "2g.12gb", 0),
    ];
    for &(model, name, start) in cases {
        let l = MigLayout::<u32>::new(model).unwrap();
        assert_eq!(can_place(&l, name), Some(start), "{model} {name}");
    }
    let mut l = MigLayout::<u32>::new("A100-40GB").unwrap();
    let a = place(&mut l, "3g.20gb", 1).unwrap();
    assert_eq!((a.instance.start, a.created), (4, true));
    let counts: Vec<_> = placeable_counts(&l)
        .iter()
        .map(|(p, n)| (p.name, *n))
        .collect();
    assert_eq!(
        counts,
        [
            ("1g.5gb", 4),
            ("1g.5gb+me", 1),
            ("2g.10gb", 2),
            ("3g.20gb", 1),
            ("4g.20gb", 1),
            ("7g.40gb", 0)
        ]
    );
    assert_eq!(place(&mut l, "4g.20gb", 2).unwrap().instance.start, 0);
    assert!(placeable_counts(&l).iter().all(|(_, n)| *n == 0));
    assert_eq!(
        place(&mut l, "1g.5gb", 3),
        Err(MigError::NoFit {
            model: "A100-40GB",
            profile: "1g.5gb"
        })
    );
    // Small instances pack from the top down, leaving 4g at 0 possible.
    let mut l = MigLayout::<u32>::new("A100-40GB").unwrap();
    let starts: Vec<u8> = (0..3)
        .map(|i| place(&mut l, "1g.5gb", i).unwrap().instance.start)
        .collect();
    assert_eq!(starts, [6, 4, 5]);
    assert_eq!(placeable(&l, "4g.20gb"), 1);
}

#[test]
fn a_live_gpu_is_not_resliced() {
    let mut l = MigLayout::<u32>::new("A100-40GB").unwrap();
    for s in 0..7 {
        l.provision("1g.5gb", s).unwrap();
    }
    assert!(l.is_idle());
    let first = place(&mut l, "1g.5gb", 1).unwrap();
    assert_eq!((first.instance.start, first.created), (0, false));
    assert!(!l.is_idle());
    assert_eq!(can_place(&l, "2g.10gb"), None);
    assert_eq!(placeable(&l, "2g.10gb"), 0);
    assert_eq!(placeable(&l, "1g.5gb"), 6);
    assert_eq!(can_place(&l, "1g.5gb"), Some(1));
    // Releasing a provisioned instance keeps it, free.
    let before = l.clone();
    place(&mut l, "1g.5gb", 2).unwrap();
    let gone = release(&mut l, &2).unwrap();
    assert_eq!((gone.start, gone.lease), (1, Some(2)));
    assert_eq!(l, before);
    assert_eq!(release(&mut l, &99), None);
}

#[test]
fn an_idle_gpu_is_resliced_destroying_as_few_as_possible() {
    let mut l = MigLayout::<u32>::new("A100-40GB").unwrap();
    for s in 0..7 {
        l.provision("1g.5gb", s).unwrap();
    }
    let p = plan(&l, "3g.20gb").unwrap();
    assert_eq!(
        (p.start, p.reuse, p.destroy.clone()),
        (4, false, vec![4, 5, 6])
    );
    let placed = place(&mut l, "3g.20gb", 1).unwrap();
    assert_eq!(
        placed.destroyed.iter().map(|i| i.start).collect::<Vec<_>>(),
        [4, 5, 6]
    );
    assert!(placed.created);
    release(&mut l, &1).unwrap();
    let left: Vec<u8> = l.instances().iter().map(|i| i.start).collect();
    assert_eq!(left, [0, 1, 2, 3]);
    assert!(l.instances().iter().all(|i| i.is_free() && i.persistent));
    // A free instance of the profile is reused before anything is created.
    let mut l = MigLayout::<u32>::new("A30-24GB").unwrap();
    l.provision("2g.12gb", 0).unwrap();
    let p = place(&mut l, "2g.12gb", 7).unwrap();
    assert_eq!((p.instance.start, p.created), (0, false));
}

#[test]
fn one_media_extension_instance_per_gpu() {
    let mut l = MigLayout::<u32>::new("H100-80GB").unwrap();
    place(&mut l, "1g.10gb+me", 1).unwrap();
    assert_eq!(placeable(&l, "1g.10gb+me"), 0);
    assert!(matches!(
        place(&mut l, "1g.10gb+me", 2),
        Err(MigError::NoFit { .. })
    ));
    let mut l = MigLayout::<u32>::new("A30-24GB").unwrap();
    place(&mut l, "1g.6gb+me", 1).unwrap();
    assert_eq!(can_place(&l, "2g.12gb+me"), None);
    assert!(can_place(&l, "2g.12gb").is_some());
    // On an idle GPU the free +me instance is destroyed to make way.
    let mut l = MigLayout::<u32>::new("A30-24GB").unwrap();
    l.provision("1g.6gb+me", 0).unwrap();
    let p = place(&mut l, "2g.12gb+me", 1).unwrap();
    assert_eq!(p.destroyed.len(), 1);
    assert!(is_valid(&l));
}

#[test]
fn errors_and_unknowns() {
    assert!(geometry("L4-24GB").is_none());
    assert!(profiles("L4-24GB").is_empty());
    assert_eq!(profiles("H100-80GB").len(), 7);
    assert!(MigLayout::<u32>::new("nope").is_none());
    let mut l = MigLayout::<u32>::new("A100-80GB").unwrap();
    // 1g.20gb is an H100 profile, not an A100-80GB one.
    assert!(matches!(
        place(&mut l, "1g.20gb", 1),
        Err(MigError::UnknownProfile { .. })
    ));
    assert_eq!(can_place(&l, "1g.20gb"), None);
    assert_eq!(placeable(&l, "1g.20gb"), 0);
    place(&mut l, "1g.10gb", 1).unwrap();
    assert_eq!(
        place(&mut l, "2g.20gb", 1),
        Err(MigError::LeaseAlreadyPlaced)
    );
    assert!(l.provision("7g.80gb", 0).is_err());
    assert!(l.provision("1g.10gb", 7).is_err());
    assert_eq!(l.held_compute_slices(), 1);
    assert_eq!(l.instance_of(&1).map(|i| i.start), Some(6));
    assert!(MigError::LeaseAlreadyPlaced.to_string().contains("lease"));
}

mod props {
    use super::super::*;
    use super::brute_force_max;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Place(usize, u32),
        Release(u32),
        Provision(usize, usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0usize..8, 0u32..10).prop_map(|(p, l)| Op::Place(p, l)),
            3 => (0u32..10).prop_map(Op::Release),
            1 => (0usize..8, 0usize..8).prop_map(|(p, s)| Op::Provision(p, s)),
        ]
    }

    fn apply(layout: &mut MigLayout<u32>, op: &Op) {
        let ps = layout.geometry().profiles;
        match *op {
            Op::Place(p, lease) => match place(layout, ps[p % ps.len()].name, lease) {
                Ok(_) | Err(MigError::NoFit { .. }) | Err(MigError::LeaseAlreadyPlaced) => {}
                Err(e) => panic!("unexpected {e}"),
            },
            Op::Release(lease) => {
                release(layout, &lease);
            }
            Op::Provision(p, s) => {
                let p = &ps[p % ps.len()];
                let _ = layout.provision(p.name, p.starts[s % p.starts.len()]);
            }
        }
    }

    fn build(gi: usize, ops: &[Op]) -> MigLayout<u32> {
        let mut l = MigLayout::empty(&geometries()[gi]);
        for op in ops {
            apply(&mut l, op);
        }
        l
    }

    fn check_slices(l: &MigLayout<u32>) -> Result<(), TestCaseError> {
        let g = l.geometry();
        let compute: u32 = l
            .instances()
            .iter()
            .map(|i| u32::from(i.profile.compute_slices))
            .sum();
        let memory: u32 = l
            .instances()
            .iter()
            .map(|i| u32::from(i.profile.memory_slices))
            .sum();
        prop_assert!(compute <= u32::from(g.compute_slices));
        prop_assert!(memory <= u32::from(g.memory_slices));
        prop_assert_eq!(l.compute_mask().count_ones(), compute);
        prop_assert_eq!(l.memory_mask().count_ones(), memory);
        prop_assert!(l.compute_mask() < 1 << g.compute_slices);
        prop_assert!(l.memory_mask() < 1 << g.memory_slices);
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn any_sequence_keeps_the_layout_valid(
            gi in 0usize..5,
            ops in prop::collection::vec(op(), 0..48),
        ) {
            let mut l = MigLayout::empty(&geometries()[gi]);
            for op in &ops {
                apply(&mut l, op);
                prop_assert!(is_valid(&l), "{:?} after {:?}", l, op);
                check_slices(&l)?;
            }
        }

        #[test]
        fn place_then_release_restores_the_layout(
            gi in 0usize..5,
            ops in prop::collection::vec(op(), 0..32),
        ) {
            let before = build(gi, &ops);
            for p in before.geometry().profiles {
                let mut l = before.clone();
                let expected = can_place(&before, p.name);
                match place(&mut l, p.name, 1000) {
                    Ok(placed) => {
                        prop_assert_eq!(Some(placed.instance.start), expected);
                        prop_assert!(is_valid(&l));
                        check_slices(&l)?;
                        let released = release(&mut l, &1000).unwrap();
                        prop_assert_eq!(released, placed.instance);
                        let mut want = before.clone();
                        want.instances.retain(|i| !placed.destroyed.contains(i));
                        prop_assert!(placed.destroyed.is_empty() || before.is_idle());
                        prop_assert_eq!(l, want);
                    }
                    Err(e) => {
                        prop_assert_eq!(expected, None);
                        prop_assert_eq!(l, before.clone(), "a refused place changed the layout: {}", e);
                    }
                }
            }
        }

        #[test]
        fn can_place_is_deterministic(
            gi in 0usize..5,
            ops in prop::collection::vec(op(), 0..32),
        ) {
            let l = build(gi, &ops);
            prop_assert_eq!(&l, &build(gi, &ops));
            for p in l.geometry().profiles {
                let copy = l.clone();
                prop_assert_eq!(plan(&l, p.name), plan(&l, p.name));
                prop_assert_eq!(can_place(&l, p.name), can_place(&copy, p.name));
                let (mut a, mut b) = (l.clone(), l.clone());
                prop_assert_eq!(place(&mut a, p.name, 77), place(&mut b, p.name, 77));
                prop_assert_eq!(a, b);
            }
        }

        #[test]
        fn can_place_finds_a_slot_whenever_one_exists(
            gi in 0usize..5,
            ops in prop::collection::vec(op(), 0..32),
        ) {
            let l = build(gi, &ops);
            let g = l.geometry();
            for p in g.profiles {
                // Oracle from `validate` alone: a free instance of the
                // profile, an idle GPU (re-sliced), or some allowed start
                // where a new instance is valid next to all others.
                let free = l.instances().iter().any(|i| i.is_free() && i.profile == p);
                let slot = p.starts.iter().any(|&s| {
                    let mut inst = l.instances().to_vec();
                    inst.push(Instance { profile: p, start: s, lease: Some(1000), persistent: false, unowned: false });
                    MigLayout::from_instances(g, inst).is_ok()
                });
                let exists = free || l.is_idle() || slot;
                prop_assert_eq!(can_place(&l, p.name).is_some(), exists, "{} on {:?}", p.name, l);
                prop_assert_eq!(placeable(&l, p.name) > 0, exists);
            }
        }

        #[test]
        fn placeable_counts_are_what_successive_places_achieve(
            gi in 0usize..5,
            ops in prop::collection::vec(op(), 0..32),
        ) {
            let l = build(gi, &ops);
            let g = l.geometry();
            for (p, count) in placeable_counts(&l) {
                if l.is_idle() {
                    prop_assert_eq!(count, p.max_instances);
                    prop_assert_eq!(count, brute_force_max(g, p));
                    continue;
                }
                let mut m = l.clone();
                let mut placed = 0u8;
                while place(&mut m, p.name, 1000 + u32::from(placed)).is_ok() {
                    placed += 1;
                }
                prop_assert_eq!(placed, count, "{} on {:?}", p.name, l);
            }
        }
    }
}
