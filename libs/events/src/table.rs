//! The macro behind the event table in `lib.rs`: from one line per event
//! type it generates [`EventData`](crate::EventData), its `event_type`,
//! `version`, `aggregate_subject`, `lease_id` and `tenant_id`, [`EVENT_TYPES`](crate::EVENT_TYPES)
//! and the schema list, so that adding an event is one line plus its struct.

/// `"type" v=N => Payload @ aggregate(id fields…)[, tenant_id = field];`
///
/// The aggregate names the subject builder in [`crate::subject`]; events of
/// the `lease` aggregate also answer `lease_id()`, which guarded lease writers
/// use to count every event on a lease's aggregate.
macro_rules! events {
    ($(
        $type:literal v = $version:literal => $payload:ident
            @ $aggregate:ident ( $($id:ident),* )
            $(, tenant_id = $tenant:ident)? ;
    )*) => {
        /// Every event. The `type` tag is the event type name.
        // Unboxed although `lease.requested` is the largest by some 200
        // bytes: an event is made once and moved into its envelope, and
        // boxing one payload would change every writer and reader of it
        // for a few hundred bytes per event in hand.
        #[allow(clippy::large_enum_variant)]
        #[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
        #[serde(tag = "type", rename_all = "snake_case")]
        pub enum EventData {
            $(
                #[serde(rename = $type)]
                $payload($payload),
            )*
        }

        /// Every event type: its name, its current version and its aggregate.
        pub const EVENT_TYPES: &[(&str, u16, &str)] = &[
            $(($type, $version, stringify!($aggregate)),)*
        ];

        impl EventData {
            pub fn event_type(&self) -> &'static str {
                match self {
                    $(EventData::$payload(_) => $type,)*
                }
            }

            /// The version of this event's type that the code writes.
            pub fn version(&self) -> u16 {
                match self {
                    $(EventData::$payload(_) => $version,)*
                }
            }

            /// The subject of the aggregate this event belongs to: what a
            /// guard covers. The event itself is stored below it, on
            /// [`Envelope::subject`](crate::Envelope::subject).
            pub fn aggregate_subject(&self) -> String {
                match self {
                    $(EventData::$payload(_e) => events!(@subject _e $aggregate ($($id),*)),)*
                }
            }

            /// The lease whose subject this event is on, for events of a lease.
            /// Writers that guard on a lease's subject sequence must count every
            /// one of these, not only the types they act on.
            pub fn lease_id(&self) -> Option<uuid::Uuid> {
                match self {
                    $(EventData::$payload(_e) => events!(@lease_id _e $aggregate ($($id),*)),)*
                }
            }

            /// The tenant the event belongs to, where the payload names one.
            pub fn tenant_id(&self) -> Option<uuid::Uuid> {
                match self {
                    $(EventData::$payload(_e) => events!(@tenant_id _e $($tenant)?),)*
                }
            }
        }

        /// The payload schema of every event type, keyed by its file name.
        fn payload_schemas() -> Vec<(String, serde_json::Value)> {
            vec![
                $((
                    format!("{}.v{}.json", $type, $version),
                    $crate::schema::of::<$payload>(),
                ),)*
            ]
        }
    };

    (@subject $e:ident lease ($id:ident)) => { $crate::subject::lease($e.$id) };
    (@subject $e:ident charge ($id:ident)) => { $crate::subject::charge($e.$id) };
    (@subject $e:ident tenant ($id:ident)) => { $crate::subject::tenant($e.$id) };
    (@subject $e:ident node ($id:ident)) => { $crate::subject::node(&$e.$id) };
    (@subject $e:ident node_view ($id:ident)) => { $crate::subject::node_view(&$e.$id) };
    (@subject $e:ident spot ($zone:ident, $model:ident)) => {
        $crate::subject::spot(&$e.$zone, &$e.$model)
    };
    (@subject $e:ident price_book ()) => { $crate::subject::price_book() };
    (@subject $e:ident audit ()) => { $crate::subject::audit() };
    (@subject $e:ident access ()) => { $crate::subject::access_refusals() };
    (@subject $e:ident security ()) => { $crate::subject::security_refusals() };
    (@subject $e:ident invoice ()) => { $crate::subject::invoices() };
    (@subject $e:ident credit ($id:ident)) => { $crate::subject::credit($e.$id) };
    (@subject $e:ident reservation ($id:ident)) => { $crate::subject::reservation($e.$id) };
    (@subject $e:ident balance ($id:ident)) => { $crate::subject::balance($e.$id) };
    (@subject $e:ident quote ($id:ident)) => { $crate::subject::quote($e.$id) };
    (@subject $e:ident session ($id:ident)) => { $crate::subject::session($e.$id) };
    (@subject $e:ident ssh_key ($id:ident)) => { $crate::subject::ssh_key($e.$id) };
    (@subject $e:ident storage ($id:ident)) => { $crate::subject::storage($e.$id) };
    (@subject $e:ident dataset ($id:ident)) => { $crate::subject::dataset($e.$id) };
    (@subject $e:ident workspace ($id:ident)) => { $crate::subject::workspace($e.$id) };

    (@lease_id $e:ident lease ($id:ident)) => { Some($e.$id) };
    (@lease_id $e:ident $other:ident ($($id:ident),*)) => { None };

    (@tenant_id $e:ident $tenant:ident) => { Some($e.$tenant) };
    (@tenant_id $e:ident) => { None };
}
