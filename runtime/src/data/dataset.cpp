// tnt::Dataset itself: a handle on the last stage of a pipeline.
#include "data/dataset_node.hpp"

namespace tnt {
namespace {

class EmptyIterator : public detail::ElementIterator {
 public:
  std::optional<Element> next() override { return std::nullopt; }
};

class EmptyNode : public detail::DatasetNode {
 public:
  std::unique_ptr<detail::ElementIterator> iterate(int64_t) const override {
    return std::make_unique<EmptyIterator>();
  }
  int64_t cardinality() const override { return 0; }
};

}  // namespace

Dataset::Dataset() : node_(std::make_shared<EmptyNode>()) {}

Dataset::Dataset(std::shared_ptr<const detail::DatasetNode> node) : node_(std::move(node)) {
  TNT_CHECK(node_ != nullptr, "Dataset: null stage");
}

int64_t Dataset::cardinality() const {
  int64_t n = node_->cardinality();
  return n < 0 ? -1 : n;
}

bool Dataset::reshuffles_each_epoch() const { return node_->reshuffles(); }

Dataset::Iterator Dataset::iterate(int64_t epoch) const { return Iterator(node_->iterate(epoch)); }

Dataset::Iterator::Iterator(std::unique_ptr<detail::ElementIterator> impl) : impl_(std::move(impl)) {}
Dataset::Iterator::Iterator(Iterator&&) noexcept = default;
Dataset::Iterator& Dataset::Iterator::operator=(Iterator&&) noexcept = default;
Dataset::Iterator::~Iterator() = default;

std::optional<Element> Dataset::Iterator::next() {
  TNT_CHECK(impl_ != nullptr, "Dataset::Iterator: used after being moved from");
  return impl_->next();
}

}  // namespace tnt
