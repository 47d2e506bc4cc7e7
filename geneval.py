"""GenEval's rules (Ghosh et al. 2023): which detections count as objects, counting, colour and position checks,
GenEval's strict correctness and Flow-GRPO's partial credit, and the Mask2Former pre/post-processing GenEval's
mmdet pipeline applies. Pure functions on detections; the detector and CLIP themselves are loaded by rewards.py
(`load_geneval`, the reward the paper's compositional-generation task trains on, Sec. 5.1; docs/method.md,
'Rewards').

After djghosh13/geneval evaluation/evaluate_images.py; the constants are its defaults: THRESHOLD 0.3,
COUNTING_THRESHOLD 0.9, MAX_OBJECTS 16, NMS_THRESHOLD (max_overlap) 1.0, POSITION_THRESHOLD 0.1. The training
reward is Flow-GRPO's partial credit (yifan123/reward-server reward_server/gen_eval.py, evaluate_reward).

Tested by `python -m pytest tests/test_rewards.py` (the judge against GenEval's and Flow-GRPO's rules on hand-made
detections, the pre/post-processing against mmdet's definitions).

Shape legend: K detections, Q Mask2Former queries, C classes, N images, H/W image height/width in pixels
(H'/W' after Mask2Former's resizing and padding), D CLIP embedding width. Only decoded images appear here, so
the pixels keep the capitals (no window length W in this file).
"""

import numpy as np
import torch
import torch.nn.functional as F

GENEVAL_THRESHOLD = 0.3
GENEVAL_COUNTING_THRESHOLD = 0.9
GENEVAL_MAX_OBJECTS = 16
GENEVAL_NMS_THRESHOLD = 1.0  # 1.0 = no suppression
GENEVAL_POSITION_THRESHOLD = 0.1
GENEVAL_COLORS = ["red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white"]
GENEVAL_COLOR_TEMPLATES = ["a photo of a {c} {cls}", "a photo of a {c}-colored {cls}", "a photo of a {c} object"]
GENEVAL_BACKGROUND = 0x99 / 255  # ImageCrops: the object is pasted on a "#999" grey image before cropping its box
GENEVAL_TAGS = ["single_object", "two_object", "counting", "colors", "position", "color_attr"]
# GenEval's object_names.txt: the 80 COCO classes in detector label order (a few renamed, e.g. "tv remote").
GENEVAL_CLASSES = (
    "person,bicycle,car,motorcycle,airplane,bus,train,truck,boat,traffic light,fire hydrant,stop sign,parking meter,"
    "bench,bird,cat,dog,horse,sheep,cow,elephant,bear,zebra,giraffe,backpack,umbrella,handbag,tie,suitcase,frisbee,"
    "skis,snowboard,sports ball,kite,baseball bat,baseball glove,skateboard,surfboard,tennis racket,bottle,"
    "wine glass,cup,fork,knife,spoon,bowl,banana,apple,sandwich,orange,broccoli,carrot,hot dog,pizza,donut,cake,"
    "chair,couch,potted plant,bed,dining table,toilet,tv,laptop,computer mouse,tv remote,computer keyboard,"
    "cell phone,microwave,oven,toaster,sink,refrigerator,book,clock,vase,scissors,teddy bear,hair drier,toothbrush"
).split(",")
# mmdet's test pipeline for this model: Resize(img_scale=(1333, 800), keep_ratio) + Pad(size_divisor=32),
# ImageNet mean/std (mmdet: [123.675, 116.28, 103.53] / [58.395, 57.12, 57.375] on 0-255 pixels).
M2F_SHORT, M2F_LONG, M2F_DIVISOR = 800, 1333, 32
M2F_MEAN, M2F_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
M2F_MAX_PER_IMAGE = 100  # mmdet test_cfg max_per_image


def compute_iou(box_a, box_b):
    """GenEval's IoU, with its +1 pixel convention on (x1, y1, x2, y2) boxes."""
    def area(b):
        return max(b[2] - b[0] + 1, 0) * max(b[3] - b[1] + 1, 0)
    inter = area([max(box_a[0], box_b[0]), max(box_a[1], box_b[1]), min(box_a[2], box_b[2]), min(box_a[3], box_b[3])])
    union = area(box_a) + area(box_b) - inter
    return inter / union if union else 0


def relative_position(box_a, box_b, threshold=GENEVAL_POSITION_THRESHOLD):
    """Relations of A to B ("left of", "right of", "above", "below"; image y grows downwards).

    The centre offset is shrunk by threshold * (size_a + size_b) per axis; a relation holds when the shrunk
    offset, divided by the length of the raw offset, exceeds 0.5 on that axis.
    """
    a, b = np.asarray(box_a[:4], float).reshape(2, 2), np.asarray(box_b[:4], float).reshape(2, 2)
    offset = a.mean(0) - b.mean(0)  # (2,) centre of A minus centre of B
    dims = np.abs(np.diff(a, axis=0))[0] + np.abs(np.diff(b, axis=0))[0]  # (2,) width_a + width_b, height_a + height_b
    revised = np.maximum(np.abs(offset) - threshold * dims, 0) * np.sign(offset)  # (2,)
    if np.all(np.abs(revised) < 1e-3):
        return set()
    dx, dy = revised / np.linalg.norm(offset)
    return {name for name, holds in [("left of", dx < -0.5), ("right of", dx > 0.5),
                                      ("above", dy < -0.5), ("below", dy > 0.5)] if holds}


def position_met(objects, relation, targets, threshold=GENEVAL_POSITION_THRESHOLD):
    """Every object (box, colour) of `objects` stands in `relation` ("left of", ...) to every object of `targets`,
    the objects of an earlier requirement (None when that requirement was not met: then the position is not)."""
    return targets is not None and all(relation in relative_position(box, other, threshold)
                                       for box, _ in objects for other, _ in targets)


def select_objects(boxes, labels, scores, threshold, max_objects=GENEVAL_MAX_OBJECTS,
                   nms_threshold=GENEVAL_NMS_THRESHOLD):
    """GenEval's per-class filter: score > threshold, best first, at most max_objects, greedy NMS.

    boxes (K, 4), labels (K,) indices into GENEVAL_CLASSES, scores (K,). Returns {class name: [detection index]}.
    """
    boxes, labels, scores = (np.asarray(torch.as_tensor(t).cpu()) for t in (boxes, labels, scores))
    selected = {}
    for label in np.unique(labels):
        candidates = np.flatnonzero(labels == label)
        candidates = candidates[np.argsort(-scores[candidates], kind="stable")]  # best first
        order = [int(i) for i in candidates if scores[i] > threshold][:max_objects]
        kept = []
        while order:
            best = order.pop(0)
            kept.append(best)
            order = [i for i in order if nms_threshold == 1 or compute_iou(boxes[best], boxes[i]) < nms_threshold]
        if kept:
            selected[GENEVAL_CLASSES[int(label)]] = kept
    return selected


def geneval_judge(objects, metadata, position_threshold=GENEVAL_POSITION_THRESHOLD):
    """GenEval's rules on detections -> (correct, partial credit).

    objects: {class name: [(box (x1, y1, x2, y2), colour or None), ...]} best first; a colour is needed only for
    the first `count` objects of a class whose requirement names a colour. metadata: GenEval's record
    {"tag", "include": [{"class", "count", "color"?, "position"?: [relation, index of an earlier include]}],
    "exclude": [{"class", "count"}]}.

    correct (GenEval's evaluate): every include is met by its `count` best objects (colour: all of them that
    colour; position: each of them in the relation to each object of the target include, which must itself be
    met), and no exclude class has >= its count objects.
    partial (Flow-GRPO's evaluate_reward): mean over requirement terms: per include 1 - |count - found| / count
    (negative when more than 2 * count are found, as in Flow-GRPO); if found == count, its colour term
    1 - |count - matching| / count and position term 1/0; if found != count, one 0 for its colour/position.
    DEVIATION: a failed position check adds one term, 0 (the term says whether the position is met); Flow-GRPO's
    loop adds 0, then 1 (docs/deviations.md, 'GenEval').
    """
    correct, terms, met_groups, partial_groups = True, [], [], []
    for req in metadata.get("include", []):
        found, count = objects.get(req["class"], []), req["count"]
        # GenEval: judge the `count` most confident objects (more than count is fine here; exclude catches it).
        best = found[:count]
        met = len(best) >= count
        if met and "color" in req:
            met = sum(color == req["color"] for _, color in best) >= count
        if met and "position" in req:
            relation, target = req["position"]
            met = position_met(best, relation, met_groups[target], position_threshold)
        correct = correct and met
        met_groups.append(best if met else None)
        # Flow-GRPO: exact count first, then colour and position only when the count is exact.
        terms.append(1 - abs(count - len(found)) / count)
        exact = len(found) == count
        if not exact and ("color" in req or "position" in req):
            terms.append(0.0)
        if exact and "color" in req:
            matching = sum(color == req["color"] for _, color in found)
            terms.append(1 - abs(count - matching) / count)
            exact = matching == count
        if exact and "position" in req:
            relation, target = req["position"]
            exact = position_met(found, relation, partial_groups[target], position_threshold)
            terms.append(float(exact))
        partial_groups.append(found if exact else None)
    for req in metadata.get("exclude", []):
        if len(objects.get(req["class"], [])) >= req["count"]:
            correct = False
    return correct, (sum(terms) / len(terms) if terms else 0.0)


def geneval_summary(correct, tags):
    """GenEval's summary_scores.py: accuracy per tag and the overall score = mean over tags of those accuracies."""
    correct = np.asarray(torch.as_tensor(correct).cpu(), float)
    per_tag = {tag: float(correct[[t == tag for t in tags]].mean()) for tag in GENEVAL_TAGS if tag in tags}
    return {"geneval_score": float(np.mean(list(per_tag.values()))),
            **{f"geneval/{tag}": acc for tag, acc in per_tag.items()}}


def masks_to_boxes(masks):
    """mmdet's mask2bbox: (K, H, W) bool -> (K, 4) float (x1, y1, x2 + 1, y2 + 1); an empty mask gives zeros."""
    k, h, w = masks.shape
    rows, cols = masks.any(dim=2), masks.any(dim=1)  # (K, H), (K, W)
    y1, x1 = rows.float().argmax(1), cols.float().argmax(1)  # (K,) first occupied row / column
    y2, x2 = h - rows.flip(1).float().argmax(1), w - cols.flip(1).float().argmax(1)  # (K,) one past the last
    boxes = torch.stack([x1, y1, x2, y2], dim=1).float()  # (K, 4)
    return boxes * rows.any(1, keepdim=True)  # (K, 4)


def mask2former_instances(class_logits, mask_logits, max_per_image=M2F_MAX_PER_IMAGE):
    """mmdet MaskFormerFusionHead.instance_postprocess for one image.

    class_logits (Q, C + 1) with the no-object class last; mask_logits (Q, H, W) at image resolution.
    The best max_per_image (query, class) pairs; score = class probability * mean mask probability inside the
    mask. Returns boxes (K, 4), labels (K,), scores (K,), masks (K, H, W) bool.
    """
    num_classes = class_logits.shape[-1] - 1
    probs = class_logits.float().softmax(-1)[:, :-1]  # (Q, C)
    top_scores, top = probs.flatten().topk(min(max_per_image, probs.numel()))  # (K,)
    labels, query = top % num_classes, top // num_classes  # (K,)
    logits = mask_logits[query].float()  # (K, H, W)
    masks = logits > 0  # (K, H, W)
    mask_scores = (logits.sigmoid() * masks).flatten(1).sum(1) / (masks.flatten(1).sum(1) + 1e-6)  # (K,)
    return masks_to_boxes(masks), labels, top_scores * mask_scores, masks


def zero_shot_weights(text_features, num_classes):
    """clip_benchmark's zero_shot_classifier: (num_classes * T, D) normalized embeddings, the T templates of each
    class consecutive -> (num_classes, D): per class the normalized mean of its templates."""
    grouped = text_features.view(num_classes, -1, text_features.shape[-1])  # (num_classes, T, D)
    return F.normalize(grouped.mean(1), dim=-1)  # (num_classes, D)


def object_crops(image, boxes, masks):
    """GenEval's ImageCrops: each object pasted on a "#999" grey image, then cut to its box.

    image (3, H, W), boxes (k, 4) (x1, y1, x2, y2), masks (k, H, W) bool -> k crops (3, y2 - y1, x2 - x1).
    """
    crops = []
    for (x1, y1, x2, y2), mask in zip(boxes.long().tolist(), masks):
        pasted = torch.where(mask, image, torch.full_like(image, GENEVAL_BACKGROUND))  # (3, H, W)
        crops.append(pasted[:, y1:max(y2, y1 + 1), x1:max(x2, x1 + 1)])  # (3, h, w), at least one pixel
    return crops


def mask2former_inputs(images):
    """mmdet test pipeline on (N, 3, H, W) [0, 1] images -> pixels (N, 3, H', W') padded to /32, mask, (h, w)."""
    h, w = images.shape[-2:]
    scale = min(M2F_SHORT / min(h, w), M2F_LONG / max(h, w))
    new_h, new_w = int(h * scale + 0.5), int(w * scale + 0.5)  # mmcv.rescale_size rounding
    x = F.interpolate(images, size=(new_h, new_w), mode="bilinear", align_corners=False)  # (N, 3, h', w')
    mean = torch.tensor(M2F_MEAN, device=images.device).view(1, 3, 1, 1)  # (1, 3, 1, 1)
    std = torch.tensor(M2F_STD, device=images.device).view(1, 3, 1, 1)  # (1, 3, 1, 1)
    pad_h, pad_w = -new_h % M2F_DIVISOR, -new_w % M2F_DIVISOR
    x = F.pad((x - mean) / std, (0, pad_w, 0, pad_h))  # (N, 3, H', W') zeros after normalization, as mmdet
    pixel_mask = torch.zeros(x.shape[0], *x.shape[-2:], dtype=torch.long, device=x.device)  # (N, H', W')
    pixel_mask[:, :new_h, :new_w] = 1
    return x, pixel_mask, (new_h, new_w)
