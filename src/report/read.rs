//! Reading report.json back, after the report stage: for readers that want every stack
//! as a list of frame objects (format 4's shape), the indices of format 5 replaced by the
//! frames of their process's table.

use serde_json::Value;

/// Replaces, in every process of a parsed report.json, each stack's, injected failure's,
/// crash's and heap error's frame indices by copies of the frames they name in the
/// process's `frames`. An index past the table's end becomes null. Frames already given
/// as objects (format 4 and earlier) are left as they are.
pub fn inline_frames(report: &mut Value) {
    let Some(processes) = report.get_mut("processes").and_then(Value::as_array_mut) else {
        return;
    };
    for process in processes {
        let table = match process.get("frames").and_then(Value::as_array) {
            Some(table) => table.clone(),
            None => continue,
        };
        let resolve = |frames: &mut Value| {
            if let Some(list) = frames.as_array_mut() {
                for frame in list {
                    if let Some(index) = frame.as_u64() {
                        *frame = table.get(index as usize).cloned().unwrap_or(Value::Null);
                    }
                }
            }
        };
        for list in ["stacks", "injected_failures", "leaks"] {
            for item in array_items(process, list) {
                if let Some(frames) = item.get_mut("frames") {
                    resolve(frames);
                }
            }
        }
        if let Some(frames) = process.get_mut("crash").and_then(|c| c.get_mut("frames")) {
            resolve(frames);
        }
        for error in array_items(process, "errors") {
            for stack in ["stack", "alloc_stack", "free_stack"] {
                if let Some(frames) = error.get_mut(stack) {
                    resolve(frames);
                }
            }
        }
    }
}

/// [`inline_frames`] on report.json's text.
pub fn parse_with_frames_inlined(json: &str) -> serde_json::Result<Value> {
    let mut report = serde_json::from_str(json)?;
    inline_frames(&mut report);
    Ok(report)
}

fn array_items<'v>(process: &'v mut Value, key: &str) -> impl Iterator<Item = &'v mut Value> {
    process
        .get_mut(key)
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn indices_become_the_frames_they_name() {
        let a = json!({"function": "a"});
        let b = json!({"function": "b"});
        let mut report = json!({"format_version": 5, "processes": [{
            "frames": [a, b],
            "stacks": [{"id": 1, "frames": [1, 0]}],
            "injected_failures": [{"frames": [0]}],
            "crash": {"signal": 11, "frames": [1, 7]},
            "errors": [{"stack": [0], "alloc_stack": null, "free_stack": [1]}]
        }]});
        inline_frames(&mut report);
        let p = &report["processes"][0];
        assert_eq!(p["stacks"][0]["frames"], json!([b, a]));
        assert_eq!(p["injected_failures"][0]["frames"], json!([a]));
        assert_eq!(p["crash"]["frames"], json!([b, null]));
        assert_eq!(p["errors"][0]["stack"], json!([a]));
        assert_eq!(p["errors"][0]["alloc_stack"], Value::Null);
        assert_eq!(p["errors"][0]["free_stack"], json!([b]));
    }

    #[test]
    fn frame_objects_of_older_formats_are_left_alone() {
        let text = r#"{"processes": [{"stacks": [{"frames": [{"function": "f"}]}]}]}"#;
        let report = parse_with_frames_inlined(text).unwrap();
        assert_eq!(
            report["processes"][0]["stacks"][0]["frames"],
            json!([{"function": "f"}])
        );
    }
}
