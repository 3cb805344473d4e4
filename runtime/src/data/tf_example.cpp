// tf.train.Example records (tarantella/tfrecord.hpp: serialize_example, parse_example) and
// the ImageNet shards' two-feature view of one (tarantella/imagenet.hpp). The bytes are
// parsed and written by the protobuf library with our subset of TensorFlow's messages
// (runtime/proto/tf_subset.proto); the TFRecord framing around them is data/tfrecord.cpp.
#include "tarantella/tfrecord.hpp"

#include "tarantella/check.hpp"
#include "tarantella/imagenet.hpp"
#include "tf_subset.pb.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <climits>
#include <string>
#include <vector>

namespace tnt {
namespace {

// Protocol buffers: deterministic bytes (map entries in key order), so that the same
// Example always gives the same record.
std::string serialize_deterministic(const google::protobuf::MessageLite& message) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    TNT_CHECK(message.SerializeToCodedStream(&coded), "serializing a {} failed", message.GetTypeName());
  }
  return out;
}

tfpb::Example parse_example_proto(const uint8_t* data, size_t size, const std::string& where) {
  if (size > static_cast<size_t>(INT_MAX))
    TNT_INPUT_ERROR("tf.train.Example in {}: {} bytes, more than a protocol buffer may hold", where, size);
  tfpb::Example proto;
  if (!proto.ParseFromArray(data, static_cast<int>(size)))
    TNT_INPUT_ERROR("tf.train.Example in {}: {} bytes that are not a valid tf.train.Example protocol buffer", where,
                    size);
  return proto;
}

}  // namespace

// ---- tf.train.Example

std::string serialize_example(const Example& example) {
  tfpb::Example proto;
  auto& features = *proto.mutable_features()->mutable_feature();
  auto add = [&](const std::string& key) -> tfpb::Feature& {
    TNT_CHECK(!features.contains(key), "serialize_example: feature '{}' appears with two kinds", key);
    return features[key];
  };
  for (const auto& [key, values] : example.int64_features)
    add(key).mutable_int64_list()->mutable_value()->Add(values.begin(), values.end());
  for (const auto& [key, values] : example.float_features)
    add(key).mutable_float_list()->mutable_value()->Add(values.begin(), values.end());
  for (const auto& [key, values] : example.bytes_features) {
    auto* list = add(key).mutable_bytes_list()->mutable_value();
    for (const auto& v : values) list->Add(std::string(v));
  }
  return serialize_deterministic(proto);
}

Example parse_example(std::string_view data, const std::string& where) {
  tfpb::Example proto = parse_example_proto(reinterpret_cast<const uint8_t*>(data.data()), data.size(), where);
  Example ex;
  for (const auto& [key, feature] : proto.features().feature()) {
    switch (feature.kind_case()) {
      case tfpb::Feature::kInt64List:
        ex.int64_features[key].assign(feature.int64_list().value().begin(), feature.int64_list().value().end());
        break;
      case tfpb::Feature::kFloatList:
        ex.float_features[key].assign(feature.float_list().value().begin(), feature.float_list().value().end());
        break;
      case tfpb::Feature::kBytesList:
        ex.bytes_features[key].assign(feature.bytes_list().value().begin(), feature.bytes_list().value().end());
        break;
      case tfpb::Feature::KIND_NOT_SET:
        break;
    }
  }
  return ex;
}

// ---- the ImageNet view: image/encoded (bytes) and image/class/label (int64)

std::vector<uint8_t> encode_example(const ImageExample& example) {
  tfpb::Example proto;
  auto& features = *proto.mutable_features()->mutable_feature();
  features["image/encoded"].mutable_bytes_list()->add_value(example.encoded.data(), example.encoded.size());
  features["image/class/label"].mutable_int64_list()->add_value(example.label);
  std::string bytes = serialize_deterministic(proto);
  return std::vector<uint8_t>(bytes.begin(), bytes.end());
}

ImageExample parse_example(const uint8_t* data, size_t size, const std::string& where) {
  return parse_example(data, size, where, "image/encoded", "image/class/label");
}

ImageExample parse_example(const uint8_t* data, size_t size, const std::string& where,
                           const std::string& image_feature, const std::string& label_feature) {
  tfpb::Example proto = parse_example_proto(data, size, where);
  const auto& features = proto.features().feature();
  ImageExample ex;
  // A repeated field's last value wins, as before the protobuf library did the parsing.
  auto image = features.find(image_feature);
  if (image == features.end() || !image->second.has_bytes_list() || image->second.bytes_list().value().empty())
    TNT_INPUT_ERROR("tf.train.Example in {}: no {} bytes_list feature", where, image_feature);
  const std::string& encoded = *image->second.bytes_list().value().rbegin();
  ex.encoded.assign(encoded.begin(), encoded.end());
  auto label = features.find(label_feature);
  if (label == features.end() || !label->second.has_int64_list() || label->second.int64_list().value().empty())
    TNT_INPUT_ERROR("tf.train.Example in {}: no {} int64_list feature", where, label_feature);
  ex.label = *label->second.int64_list().value().rbegin();
  return ex;
}

}  // namespace tnt
