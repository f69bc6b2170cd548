//! The read-strategy registry: a model's architecture and the read kind its shard reports pick the
//! strategy that renders its requests and reads its answers. Adding a strategy is one line here.

use std::path::Path;

use super::canvas::DiffusionGemmaCanvasStrategy;
use super::joint_schema::JointSchemaStrategy;
use super::liquid::LiquidStrategy;
use super::load_error::LoadError;
use super::next_token::NextTokenStrategy;
use super::{ReadStrategy, StrategyOptions};

type Load = fn(&Path, &StrategyOptions) -> Result<Box<dyn ReadStrategy>, LoadError>;

/// The kind of reads a model computes, as its shard reports it in Info (`read_kind`): the shard's
/// registry (`architectures.py`) decides it from the architecture and the folder, so the Clef marker
/// file and the media an architecture reads are facts of the shard alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardReadKind {
    NextToken,
    Canvas,
    Pooled,
}

impl ShardReadKind {
    const ALL: [ShardReadKind; 3] = [Self::NextToken, Self::Canvas, Self::Pooled];

    pub fn name(self) -> &'static str {
        match self {
            Self::NextToken => "next_token",
            Self::Canvas => "canvas",
            Self::Pooled => "pooled",
        }
    }

    /// Info's `read_kind`; empty (a shard that names none) is next-token reads.
    pub fn from_info(name: &str) -> Result<Self, RegistryError> {
        if name.is_empty() {
            return Ok(Self::NextToken);
        }
        Self::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .ok_or_else(|| RegistryError::UnknownReadKind(name.to_owned()))
    }
}

impl std::fmt::Display for ShardReadKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why no strategy serves the model: each names the architecture and, where two sides disagree, both.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("the shard reports read kind '{0}', which this router does not know (next_token, canvas, pooled)")]
    UnknownReadKind(String),
    #[error(
        "architecture '{architecture}': the shard computes {shard} reads, and the router's strategies for it read {}",
        router.iter().map(|k| k.name()).collect::<Vec<_>>().join(", ")
    )]
    KindMismatch {
        architecture: String,
        shard: ShardReadKind,
        router: Vec<ShardReadKind>,
    },
    #[error("architecture '{architecture}'{}: {why}", kind_note(*.kind))]
    Load {
        architecture: String,
        kind: ShardReadKind,
        why: Box<LoadError>,
    },
    #[error(
        "no read strategy for architecture '{architecture}'; known: {}, and other causal language models (…ForCausalLM)",
        known_architectures().join(", ")
    )]
    UnknownArchitecture { architecture: String },
}

/// A load error names the read kind where the architecture has strategies of several.
fn kind_note(kind: ShardReadKind) -> String {
    match kind {
        ShardReadKind::Pooled => " (pooled reads: a joint-schema head)".into(),
        _ => String::new(),
    }
}

struct Entry {
    architectures: &'static [&'static str],
    /// The read kind this strategy computes; the shard's Info must report the same.
    kind: ShardReadKind,
    load: Load,
}

/// Every architecture of the seed table, each with the read kind its strategy computes. The shard's
/// read kind picks among an architecture's entries (a Clef checkpoint is a Qwen3.5 folder the shard
/// reads pooled). Architectures recognised but not served by this build load into a refusal naming
/// what they are, never into a wrong strategy.
const REGISTRY: &[Entry] = &[
    // Clef: a Qwen3.5 / Qwen3-Omni folder plus its joint-schema head, one pooled read per request.
    Entry {
        architectures: &["Qwen3_5ForConditionalGeneration"],
        kind: ShardReadKind::Pooled,
        load: JointSchemaStrategy::boxed_flash,
    },
    Entry {
        architectures: &["Qwen3OmniMoeForConditionalGeneration"],
        kind: ShardReadKind::Pooled,
        load: JointSchemaStrategy::boxed_omni,
    },
    Entry {
        architectures: &["DiffusionGemmaForBlockDiffusion"],
        kind: ShardReadKind::Canvas,
        load: DiffusionGemmaCanvasStrategy::boxed,
    },
    Entry {
        architectures: &["Lfm2VlForConditionalGeneration"],
        kind: ShardReadKind::NextToken,
        load: LiquidStrategy::boxed,
    },
    Entry {
        architectures: &[
            "Qwen3_5ForConditionalGeneration",
            "Qwen3_5MoeForConditionalGeneration",
            "Gemma4ForConditionalGeneration",
            "LlamaForCausalLM",
            "Qwen3ForCausalLM",
            "Gemma4ForCausalLM",
        ],
        kind: ShardReadKind::NextToken,
        load: NextTokenStrategy::boxed,
    },
];

/// Picks and loads the read strategy for a model whose shard computes `read_kind` reads (Info's
/// `read_kind`). The strategy reads the media the shard reports it processes (`options.modalities`).
/// An architecture with no strategy of that kind, or whose strategy cannot load (labels that are not
/// single tokens, a broken template), is an error naming why.
pub fn strategy_for(
    architecture: &str,
    read_kind: &str,
    model_dir: &Path,
    options: &StrategyOptions,
) -> Result<Box<dyn ReadStrategy>, RegistryError> {
    let kind = ShardReadKind::from_info(read_kind)?;
    let listed: Vec<&Entry> = REGISTRY
        .iter()
        .filter(|e| e.architectures.contains(&architecture))
        .collect();
    if let Some(entry) = listed.iter().find(|e| e.kind == kind) {
        return (entry.load)(model_dir, options).map_err(|why| RegistryError::Load {
            architecture: architecture.to_owned(),
            kind,
            why: Box::new(why),
        });
    }
    let causal = architecture.ends_with("ForCausalLM") || architecture.ends_with("LMHeadModel");
    if !listed.is_empty() || (causal && kind != ShardReadKind::NextToken) {
        let mut router: Vec<ShardReadKind> = listed.iter().map(|e| e.kind).collect();
        if router.is_empty() {
            router.push(ShardReadKind::NextToken);
        }
        return Err(RegistryError::KindMismatch {
            architecture: architecture.to_owned(),
            shard: kind,
            router,
        });
    }
    // Other causal language models read like Llama: one next-token read per question.
    if causal {
        return NextTokenStrategy::boxed(model_dir, options).map_err(|why| RegistryError::Load {
            architecture: architecture.to_owned(),
            kind,
            why: Box::new(why),
        });
    }
    Err(RegistryError::UnknownArchitecture {
        architecture: architecture.to_owned(),
    })
}

/// Every architecture the registry names, once each, in registry order.
fn known_architectures() -> Vec<&'static str> {
    let mut known: Vec<&'static str> = Vec::new();
    for name in REGISTRY
        .iter()
        .flat_map(|e| e.architectures.iter().copied())
    {
        if !known.contains(&name) {
            known.push(name);
        }
    }
    known
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Modality;
    use crate::prompt::fixture_dir;
    use crate::prompt::wording::Wording;

    const OPTIONS: StrategyOptions = StrategyOptions {
        max_positions: 4096,
        wording: Wording::Vllm,
        modalities: Vec::new(),
    };

    fn copy_of(fixture: &str, marker: Option<&str>) -> tempdir::Dir {
        let dir = tempdir::Dir::new();
        for file in [
            "tokenizer.json",
            "tokenizer_config.json",
            "chat_template.jinja",
            "config.json",
        ] {
            let from = fixture_dir(fixture).join(file);
            if from.is_file() {
                std::fs::copy(&from, dir.path().join(file)).expect("copy");
            }
        }
        if let Some(marker) = marker {
            std::fs::write(dir.path().join(marker), "{}").expect("marker");
        }
        dir
    }

    mod tempdir {
        /// A folder removed when dropped.
        pub struct Dir(std::path::PathBuf);
        impl Dir {
            pub fn new() -> Self {
                use std::sync::atomic::{AtomicUsize, Ordering};
                static N: AtomicUsize = AtomicUsize::new(0);
                let path = std::env::temp_dir().join(format!(
                    "di-registry-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::SeqCst)
                ));
                std::fs::create_dir_all(&path).expect("mkdir");
                Dir(path)
            }
            pub fn path(&self) -> &std::path::Path {
                &self.0
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[test]
    fn architectures_pick_their_strategies() {
        let qwen = copy_of("tiny-qwen3", None);
        for arch in [
            "Qwen3ForCausalLM",
            "Qwen3_5ForConditionalGeneration",
            "Qwen3_5MoeForConditionalGeneration",
            "Gemma4ForCausalLM",
            "Gemma4ForConditionalGeneration",
            "MistralForCausalLM",
        ] {
            let s = strategy_for(arch, "next_token", qwen.path(), &OPTIONS)
                .unwrap_or_else(|e| panic!("{arch}: {e}"));
            assert_eq!(s.name(), "next_token", "{arch}");
        }
        let s = strategy_for(
            "Lfm2VlForConditionalGeneration",
            "next_token",
            qwen.path(),
            &OPTIONS,
        )
        .expect("liquid loads");
        assert_eq!(s.name(), "liquid");
    }

    /// A strategy reads the media the shard reports it processes (the shard's registry decides
    /// which media an architecture reads, and its processor which it can).
    #[test]
    fn media_are_what_the_shard_reports() {
        let qwen = copy_of("tiny-qwen3", None);
        for (arch, media) in [
            (
                "Qwen3_5ForConditionalGeneration",
                &[Modality::Image, Modality::Video][..],
            ),
            ("Gemma4ForConditionalGeneration", &[Modality::Image]),
            ("Lfm2VlForConditionalGeneration", &[Modality::Image]),
        ] {
            let reported = StrategyOptions {
                modalities: media.to_vec(),
                ..OPTIONS
            };
            let taken = |options: &StrategyOptions| {
                strategy_for(arch, "next_token", qwen.path(), options)
                    .unwrap_or_else(|e| panic!("{arch}: {e}"))
                    .modalities()
                    .to_vec()
            };
            assert_eq!(taken(&reported), media, "{arch}");
            // A folder without a processor: the shard reports none, so nothing is read.
            assert!(taken(&OPTIONS).is_empty(), "{arch}");
        }
    }

    /// The profile's wording reaches next-token strategies; Liquid d1 keeps its own under any profile.
    #[test]
    fn wording_comes_from_the_profile_and_the_strategy() {
        use crate::prompt::wording::PromptFormat;
        let qwen = copy_of("tiny-qwen3", None);
        for (wording, format) in [
            (Wording::Vllm, PromptFormat::VLLM),
            (Wording::Sglang, PromptFormat::SGLANG_V1),
        ] {
            let options = StrategyOptions { wording, ..OPTIONS };
            let s = strategy_for("Qwen3ForCausalLM", "next_token", qwen.path(), &options)
                .expect("loads");
            assert_eq!(s.prompt_format(), format);
            let s = strategy_for(
                "Lfm2VlForConditionalGeneration",
                "next_token",
                qwen.path(),
                &options,
            )
            .expect("loads");
            assert_eq!(s.prompt_format(), PromptFormat::LIQUID_D1);
        }
    }

    /// DiffusionGemma loads its canvas strategy, in its own wording under any profile.
    #[test]
    fn diffusion_gemma_loads_the_canvas_strategy() {
        use crate::prompt::wording::PromptFormat;
        let dir = copy_of("tiny-diffusiongemma", None);
        for wording in [Wording::Vllm, Wording::Sglang] {
            let options = StrategyOptions { wording, ..OPTIONS };
            let s = strategy_for(
                "DiffusionGemmaForBlockDiffusion",
                "canvas",
                dir.path(),
                &options,
            )
            .expect("loads");
            assert_eq!(s.name(), "diffusion_gemma_canvas");
            assert_eq!(s.prompt_format(), PromptFormat::DIFFUSION_GEMMA_CANVAS);
            assert!(s.supports_joint());
        }
    }

    /// A Qwen3.5 / Qwen3-Omni folder the shard reads pooled (its registry saw the joint-schema
    /// head) is Clef, its joint-schema strategy (which `/info` names); the router looks at no marker.
    #[test]
    fn the_shards_pooled_read_kind_picks_the_joint_schema_strategy() {
        let clef = copy_of("tiny-qwen3", Some("joint_head_config.json"));
        for (arch, name, media) in [
            (
                "Qwen3_5ForConditionalGeneration",
                "clef_flash",
                &[Modality::Image, Modality::Video][..],
            ),
            (
                "Qwen3OmniMoeForConditionalGeneration",
                "clef_omni",
                &[Modality::Image, Modality::Audio, Modality::Video],
            ),
        ] {
            let reported = StrategyOptions {
                modalities: media.to_vec(),
                ..OPTIONS
            };
            let s = strategy_for(arch, "pooled", clef.path(), &reported)
                .unwrap_or_else(|e| panic!("{arch}: {e}"));
            assert_eq!(s.name(), name);
            assert_eq!(s.prompt_format().name, "joint_schema");
            assert_eq!(s.modalities(), media, "{arch}");
        }
        // Read next-token, the same architecture is a plain model; Omni has no next-token strategy.
        let s = strategy_for(
            "Qwen3_5ForConditionalGeneration",
            "next_token",
            clef.path(),
            &OPTIONS,
        )
        .unwrap();
        assert_eq!(s.name(), "next_token");
        let err = strategy_for(
            "Qwen3OmniMoeForConditionalGeneration",
            "next_token",
            clef.path(),
            &OPTIONS,
        )
        .err()
        .expect("refused");
        assert!(matches!(err, RegistryError::KindMismatch { .. }), "{err}");
    }

    /// A shard and a router that disagree on how a model reads refuse it, naming both sides.
    #[test]
    fn a_read_kind_mismatch_is_refused_naming_both() {
        let qwen = copy_of("tiny-qwen3", None);
        let refusal = |arch: &str, kind: &str| {
            strategy_for(arch, kind, qwen.path(), &OPTIONS)
                .err()
                .unwrap_or_else(|| panic!("{arch} read {kind} loads"))
                .to_string()
        };
        assert_eq!(
            refusal("DiffusionGemmaForBlockDiffusion", "next_token"),
            "architecture 'DiffusionGemmaForBlockDiffusion': the shard computes next_token reads, \
             and the router's strategies for it read canvas"
        );
        assert_eq!(
            refusal("Qwen3ForCausalLM", "pooled"),
            "architecture 'Qwen3ForCausalLM': the shard computes pooled reads, \
             and the router's strategies for it read next_token"
        );
        assert_eq!(
            refusal("MistralForCausalLM", "canvas"),
            "architecture 'MistralForCausalLM': the shard computes canvas reads, \
             and the router's strategies for it read next_token"
        );
        assert!(refusal("Qwen3ForCausalLM", "diffusion")
            .contains("the shard reports read kind 'diffusion', which this router does not know"));
        // A shard that names no kind reads next-token (the proto's default).
        let s = strategy_for("Qwen3ForCausalLM", "", qwen.path(), &OPTIONS).expect("loads");
        assert_eq!(s.name(), "next_token");
    }

    #[test]
    fn unknown_and_unserved_architectures_are_refused_by_name() {
        let qwen = copy_of("tiny-qwen3", None);
        // A Qwen3 folder under the DiffusionGemma architecture: the canvas strategy loads and refuses,
        // naming the tokens it needs.
        let err = strategy_for(
            "DiffusionGemmaForBlockDiffusion",
            "canvas",
            qwen.path(),
            &OPTIONS,
        )
        .err()
        .expect("refused")
        .to_string();
        assert!(
            err.contains("architecture 'DiffusionGemmaForBlockDiffusion'")
                && err.contains("need the model's '<turn|>' and pad tokens"),
            "{err}"
        );
        let err = strategy_for("BertForMaskedLM", "next_token", qwen.path(), &OPTIONS)
            .err()
            .expect("refused")
            .to_string();
        assert!(
            err.contains("no read strategy for architecture 'BertForMaskedLM'")
                && err.contains("Lfm2VlForConditionalGeneration"),
            "{err}"
        );
    }
}
