//! The read-strategy registry: a model's `config.json` architecture, plus marker files beside it, picks
//! the strategy that renders its requests and reads its answers. Adding a strategy is one line here.

use std::path::Path;

use super::canvas::DiffusionGemmaCanvasStrategy;
use super::joint_schema::JointSchemaStrategy;
use super::liquid::LiquidStrategy;
use super::next_token::NextTokenStrategy;
use super::{ReadStrategy, StrategyOptions};
use crate::ir::Modality;

type Load = fn(&Path, &StrategyOptions) -> Result<Box<dyn ReadStrategy>, String>;

struct Entry {
    architectures: &'static [&'static str],
    /// A file that must sit beside `config.json` for this entry to apply (checked before entries without).
    marker: Option<&'static str>,
    /// The media this architecture's strategy reads (when the shard has a processor for them).
    media: &'static [Modality],
    load: Load,
}

/// Every architecture of the seed table. First match wins among entries whose marker file is present;
/// entries with a marker are tried first, so a marked folder (a Clef checkpoint is a Qwen3.5 folder plus
/// its head) never falls through to the plain strategy of its architecture. Architectures recognised
/// but not served by this build load into a refusal naming what they are, never into a wrong strategy.
const REGISTRY: &[Entry] = &[
    // Clef: a Qwen3.5 / Qwen3-Omni folder plus its joint-schema head, one pooled read per request.
    Entry {
        architectures: &["Qwen3_5ForConditionalGeneration"],
        marker: Some("joint_head_config.json"),
        media: &[Modality::Image, Modality::Video],
        load: JointSchemaStrategy::boxed_flash,
    },
    Entry {
        architectures: &["Qwen3OmniMoeForConditionalGeneration"],
        marker: Some("joint_head_config.json"),
        media: &[Modality::Image, Modality::Audio, Modality::Video],
        load: JointSchemaStrategy::boxed_omni,
    },
    Entry {
        architectures: &["DiffusionGemmaForBlockDiffusion"],
        marker: None,
        media: &[],
        load: DiffusionGemmaCanvasStrategy::boxed,
    },
    Entry {
        architectures: &["Lfm2VlForConditionalGeneration"],
        marker: None,
        media: &[Modality::Image],
        load: LiquidStrategy::boxed,
    },
    // Qwen3.5 reads images and videos (the seed's "T + I + V"; vLLM 0.33's next-token reads stop at images).
    Entry {
        architectures: &[
            "Qwen3_5ForConditionalGeneration",
            "Qwen3_5MoeForConditionalGeneration",
        ],
        marker: None,
        media: &[Modality::Image, Modality::Video],
        load: NextTokenStrategy::boxed,
    },
    Entry {
        architectures: &["Gemma4ForConditionalGeneration"],
        marker: None,
        media: &[Modality::Image],
        load: NextTokenStrategy::boxed,
    },
    Entry {
        architectures: &["LlamaForCausalLM", "Qwen3ForCausalLM", "Gemma4ForCausalLM"],
        marker: None,
        media: &[],
        load: NextTokenStrategy::boxed,
    },
];

/// Picks and loads the read strategy for a model. An architecture with no strategy, or whose strategy
/// cannot load (labels that are not single tokens, a broken template), is an error naming why.
pub fn strategy_for(
    architecture: &str,
    model_dir: &Path,
    options: &StrategyOptions,
) -> Result<Box<dyn ReadStrategy>, String> {
    let applies = |e: &&Entry| {
        e.architectures.contains(&architecture)
            && e.marker.is_none_or(|m| model_dir.join(m).is_file())
    };
    let entry = REGISTRY
        .iter()
        .filter(|e| e.marker.is_some())
        .find(applies)
        .or_else(|| REGISTRY.iter().filter(|e| e.marker.is_none()).find(applies));
    if let Some(entry) = entry {
        let options = StrategyOptions {
            modalities: options
                .modalities
                .iter()
                .copied()
                .filter(|m| entry.media.contains(m))
                .collect(),
            ..options.clone()
        };
        return (entry.load)(model_dir, &options).map_err(|why| match entry.marker {
            Some(marker) => format!("architecture '{architecture}' with {marker}: {why}"),
            None => format!("architecture '{architecture}': {why}"),
        });
    }
    // Other causal language models read like Llama: one next-token read per question.
    if architecture.ends_with("ForCausalLM") || architecture.ends_with("LMHeadModel") {
        let text_only = StrategyOptions {
            modalities: Vec::new(),
            ..options.clone()
        };
        return NextTokenStrategy::boxed(model_dir, &text_only);
    }
    Err(format!(
        "no read strategy for architecture '{architecture}'; known: {}, and other causal language models (…ForCausalLM)",
        known_architectures().join(", ")
    ))
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
            let s =
                strategy_for(arch, qwen.path(), &OPTIONS).unwrap_or_else(|e| panic!("{arch}: {e}"));
            assert_eq!(s.name(), "next_token", "{arch}");
        }
        let s = strategy_for("Lfm2VlForConditionalGeneration", qwen.path(), &OPTIONS)
            .expect("liquid loads");
        assert_eq!(s.name(), "liquid");
    }

    /// A strategy reads the media its architecture takes and the shard can process: never more.
    #[test]
    fn media_are_what_the_architecture_reads_and_the_shard_processes() {
        let qwen = copy_of("tiny-qwen3", None);
        let all = StrategyOptions {
            modalities: Modality::ALL.to_vec(),
            ..OPTIONS
        };
        let taken = |arch: &str, options: &StrategyOptions| {
            strategy_for(arch, qwen.path(), options)
                .unwrap_or_else(|e| panic!("{arch}: {e}"))
                .modalities()
                .to_vec()
        };
        for (arch, media) in [
            (
                "Qwen3_5ForConditionalGeneration",
                &[Modality::Image, Modality::Video][..],
            ),
            (
                "Qwen3_5MoeForConditionalGeneration",
                &[Modality::Image, Modality::Video],
            ),
            ("Gemma4ForConditionalGeneration", &[Modality::Image]),
            ("Lfm2VlForConditionalGeneration", &[Modality::Image]),
        ] {
            assert_eq!(taken(arch, &all), media, "{arch}");
            // A folder without a processor: the shard reports none, so nothing is read.
            assert!(taken(arch, &OPTIONS).is_empty(), "{arch}");
        }
        for arch in [
            "Qwen3ForCausalLM",
            "Gemma4ForCausalLM",
            "MistralForCausalLM",
        ] {
            assert!(taken(arch, &all).is_empty(), "{arch}");
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
            let s = strategy_for("Qwen3ForCausalLM", qwen.path(), &options).expect("loads");
            assert_eq!(s.prompt_format(), format);
            let s = strategy_for("Lfm2VlForConditionalGeneration", qwen.path(), &options)
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
            let s = strategy_for("DiffusionGemmaForBlockDiffusion", dir.path(), &options)
                .expect("loads");
            assert_eq!(s.name(), "diffusion_gemma_canvas");
            assert_eq!(s.prompt_format(), PromptFormat::DIFFUSION_GEMMA_CANVAS);
            assert!(s.supports_joint());
        }
    }

    /// A Qwen3.5 / Qwen3-Omni folder with `joint_head_config.json` is Clef (its joint-schema strategy,
    /// which `/info` names), never the plain strategy of its architecture.
    #[test]
    fn a_marker_file_is_never_read_with_the_plain_strategy() {
        let clef = copy_of("tiny-qwen3", Some("joint_head_config.json"));
        let all = StrategyOptions {
            modalities: Modality::ALL.to_vec(),
            ..OPTIONS
        };
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
            let s = strategy_for(arch, clef.path(), &all).unwrap_or_else(|e| panic!("{arch}: {e}"));
            assert_eq!(s.name(), name);
            assert_eq!(s.prompt_format().name, "joint_schema");
            assert_eq!(s.modalities(), media, "{arch}");
        }
        // Without the marker the same architecture is a plain next-token model; Omni has no plain entry.
        let plain = copy_of("tiny-qwen3", None);
        let s = strategy_for("Qwen3_5ForConditionalGeneration", plain.path(), &OPTIONS).unwrap();
        assert_eq!(s.name(), "next_token");
        assert!(strategy_for(
            "Qwen3OmniMoeForConditionalGeneration",
            plain.path(),
            &OPTIONS
        )
        .is_err());
    }

    #[test]
    fn unknown_and_unserved_architectures_are_refused_by_name() {
        let qwen = copy_of("tiny-qwen3", None);
        // A Qwen3 folder under the DiffusionGemma architecture: the canvas strategy loads and refuses,
        // naming the tokens it needs.
        let err = strategy_for("DiffusionGemmaForBlockDiffusion", qwen.path(), &OPTIONS)
            .err()
            .expect("refused");
        assert!(
            err.contains("architecture 'DiffusionGemmaForBlockDiffusion'")
                && err.contains("need the model's '<turn|>' and pad tokens"),
            "{err}"
        );
        let err = strategy_for("BertForMaskedLM", qwen.path(), &OPTIONS)
            .err()
            .expect("refused");
        assert!(
            err.contains("no read strategy for architecture 'BertForMaskedLM'")
                && err.contains("Lfm2VlForConditionalGeneration"),
            "{err}"
        );
    }
}
