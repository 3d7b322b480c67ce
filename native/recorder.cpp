// The native op recorder of --backends-determinism.
//
// A thread-local RecordFunction callback (propagated by torch to autograd's
// worker threads) sees every op call at the dispatcher. It records the same
// ops a Python TorchDispatchMode would see: the outermost op of each call
// chain that is not CompositeImplicitAutograd (composite ops are looked
// through, so `linear` is recorded as the `t` and `addmm` it calls). Per op it
// keeps the op, a key per input and a key per output:
//
// * an output is digested when the op returns (on its device; CPU digests are
//   computed in place, CUDA digests stay on the device until finish());
// * a tensor's key is reused while its version counter has not moved; a
//   tensor no op of the run produced (a parameter, data made from Python) is
//   digested at its first use, or takes the key the previous run gave it when
//   it is the same tensor, unchanged, on a storage no op wrote through an alias;
// * views are keyed by the view op and its inputs' keys, uninitialised memory
//   (empty, new_empty, ...) and workspaces of fused kernels by dtype and shape;
//   reads of uninitialised memory are tracked through views and in-place ops.
//
// finish() turns the record into Python rows of the same shape the Python
// recorder (pytest_backends/determinism/recorder.py) produces, so one
// comparison serves both.
#include "recorder.h"

#include "digest.h"
#include "digest_op.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>
#include <c10/util/flat_hash_map.h>
#include <torch/csrc/DynamicTypes.h>

#include <algorithm>
#include <tuple>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace pytest_backends {
namespace {

namespace py = pybind11;

constexpr const char* kAlertText = "does not have a deterministic implementation";

// --- what is known about an op, once per process ---------------------------------

struct OpInfo {
  std::string name;      // "aten::add" (no overload)
  std::string overload;  // checked against the call, so a reused address cannot mislead
  uint64_t name_hash = 0;
  bool op = false;       // a dispatcher op (not a named scope)
  bool composite = false;
  bool pure_view = false;
  bool uninitialized = false;
  bool overwrites = false;
  std::vector<int> workspaces;
  std::vector<int> written;  // argument positions the op writes to
  std::vector<int> outs;     // out= arguments
};

const std::unordered_set<std::string>& uninitialized_ops() {
  static const std::unordered_set<std::string> ops = {
      "aten::empty",     "aten::empty_like",    "aten::empty_strided",
      "aten::empty_permuted", "aten::new_empty", "aten::new_empty_strided",
      "aten::resize_",   "aten::resize_as_"};
  return ops;
}

const std::unordered_set<std::string>& overwrite_ops() {
  static const std::unordered_set<std::string> ops = {
      "aten::fill_",      "aten::zero_",      "aten::copy_",   "aten::normal_",
      "aten::uniform_",   "aten::random_",    "aten::bernoulli_", "aten::exponential_",
      "aten::geometric_", "aten::cauchy_",    "aten::log_normal_", "aten::set_"};
  return ops;
}

// Outputs that are scratch space of fused kernels (positions in the returns);
// recorder.py's _WORKSPACES lists the same.
const std::unordered_map<std::string, std::vector<int>>& workspace_ops() {
  static const std::unordered_map<std::string, std::vector<int>> ops = {
      {"aten::mkldnn_rnn_layer", {3}},
      {"aten::_cudnn_rnn", {3}},
      {"aten::miopen_rnn", {3}},
      {"aten::_thnn_fused_lstm_cell", {2}},
      {"aten::_thnn_fused_gru_cell", {1}},
      {"aten::cudnn_batch_norm", {3}},
      {"aten::_scaled_dot_product_flash_attention", {7, 8}},
      {"aten::_scaled_dot_product_cudnn_attention", {8}},
      {"aten::_flash_attention_forward", {3, 4}},
      {"aten::_ctc_loss", {1}}};
  return ops;
}

std::mutex g_info_mutex;
std::unordered_map<const char*, std::unique_ptr<OpInfo>> g_infos;
std::vector<std::unique_ptr<OpInfo>> g_retired;

const OpInfo& info_of_locked(const at::RecordFunction& fn);

// Per thread, so the common lookup takes no lock.
const OpInfo& info_of(const at::RecordFunction& fn) {
  thread_local std::unordered_map<const char*, const OpInfo*> cache;
  const char* key = fn.name();
  auto it = cache.find(key);
  if (it != cache.end() && std::strcmp(it->second->name.c_str(), key) == 0 &&
      std::strcmp(it->second->overload.c_str(), fn.overload_name()) == 0) {
    return *it->second;
  }
  const OpInfo& info = info_of_locked(fn);
  cache[key] = &info;
  return info;
}

const OpInfo& info_of_locked(const at::RecordFunction& fn) {
  const char* key = fn.name();
  std::lock_guard<std::mutex> lock(g_info_mutex);
  auto it = g_infos.find(key);
  if (it != g_infos.end() && it->second->name == key &&
      it->second->overload == fn.overload_name()) {
    return *it->second;
  }
  auto info = std::make_unique<OpInfo>();
  info->name = key;
  info->overload = fn.overload_name();
  info->name_hash = std::hash<std::string>{}(info->name);
  const auto name = fn.operator_name();
  if (name.has_value()) {
    const auto handle = c10::Dispatcher::singleton().findOp(*name);
    if (handle.has_value()) {
      info->op = true;
      info->composite = handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
      const c10::FunctionSchema& schema = handle->schema();
      const auto& args = schema.arguments();
      for (size_t i = 0; i < args.size(); ++i) {
        const auto* alias = args[i].alias_info();
        if (alias != nullptr && alias->isWrite()) {
          info->written.push_back(static_cast<int>(i));
          if (args[i].is_out() || args[i].kwarg_only()) {
            info->outs.push_back(static_cast<int>(i));
          }
        }
      }
      bool view = false;
      for (const auto& ret : schema.returns()) {
        if (ret.alias_info() != nullptr && !ret.alias_info()->isWrite()) {
          view = true;
        }
      }
      info->pure_view = view && info->written.empty();
      info->uninitialized = uninitialized_ops().count(info->name) > 0;
      info->overwrites = overwrite_ops().count(info->name) > 0;
      const auto ws = workspace_ops().find(info->name);
      if (ws != workspace_ops().end()) {
        info->workspaces = ws->second;
      }
    }
  }
  const OpInfo& ref = *info;
  if (it != g_infos.end()) {
    // Another op at a reused address: the old entry may still be referenced.
    g_retired.push_back(std::move(it->second));
  }
  g_infos[key] = std::move(info);
  return ref;
}

// --- keys ----------------------------------------------------------------------

enum class KeyKind : uint8_t {
  Digest,
  Pending,
  View,
  Uninitialized,
  Workspace,
  Opaque,
  Empty,
  Value  // a non-tensor output (``item()``, ``equal``): compared by value
};

struct Key {
  KeyKind kind = KeyKind::Opaque;
  bool external = false;
  const c10::StorageImpl* storage = nullptr;
  uint64_t h0 = 0;
  uint64_t h1 = 0;
  int64_t pending = -1;  // index into Recorder::pending_
  int64_t op = -1;       // view: the op that made it
  int32_t index = 0;     // view: which output of that op
  at::ScalarType dtype = at::ScalarType::Undefined;
  c10::SmallVector<int64_t, 5> shape;
  const char* reason = "";
  c10::IValue value;  // Value keys
};

struct Known {
  c10::weak_intrusive_ptr<c10::TensorImpl> weak;
  int64_t version;
  int64_t key;
};

struct Exported {
  c10::weak_intrusive_ptr<c10::TensorImpl> weak;
  int64_t version;
  Key key;
};

// An input: a tensor's key, a plain value, or a list of inputs.
struct Slot {
  enum Kind : uint8_t { Tensor, NoTensor, Value, List } kind = Value;
  int64_t key = -1;
  c10::IValue value;
  std::vector<Slot> items;
};

struct OpRecord {
  const OpInfo* info = nullptr;
  c10::DeviceType device = c10::DeviceType::CPU;
  bool has_device = false;
  at::ScalarType dtype = at::ScalarType::Undefined;
  c10::SmallVector<Slot, 3> inputs;
  c10::SmallVector<int64_t, 2> outputs;
  bool raised = false;
  bool alerted = false;
  int64_t taint = -1;  // index into Recorder::origins_
};

// A census key: (op, device type, dtype), -1 where the op touched no tensor.
struct CensusKey {
  const OpInfo* info;
  int device;
  int dtype;
  bool operator==(const CensusKey& o) const {
    return info == o.info && device == o.device && dtype == o.dtype;
  }
};

struct CensusKeyHash {
  size_t operator()(const CensusKey& k) const {
    return std::hash<const void*>{}(k.info) ^ (static_cast<size_t>(k.device + 1) << 20) ^
           (static_cast<size_t>(k.dtype + 1) << 28);
  }
};

// Forwards warnings to the handler it replaced and notes determinism alerts.
class AlertHandler : public c10::WarningHandler {
 public:
  explicit AlertHandler(c10::WarningHandler* previous) : previous_(previous) {}
  void process(const c10::Warning& warning) override {
    if (warning.msg().find(kAlertText) != std::string::npos) {
      alerted = true;
    }
    if (previous_ != nullptr) {
      previous_->process(warning);
    }
  }
  bool alerted = false;
  c10::WarningHandler* previous_;
};

// Contexts are made and freed once per recorded op: recycled per thread, not malloc'ed.
struct ContextPool {
  std::vector<void*> free;
  ~ContextPool() {
    for (void* p : free) {
      ::operator delete(p);
    }
  }
};

struct OpContext : public at::ObserverContext {
  static void* operator new(size_t size) {
    auto& pool = context_pool();
    if (size == sizeof(OpContext) && !pool.free.empty()) {
      void* p = pool.free.back();
      pool.free.pop_back();
      return p;
    }
    return ::operator new(size);
  }
  static void operator delete(void* p, size_t size) {
    auto& pool = context_pool();
    if (size == sizeof(OpContext) && pool.free.size() < 64) {
      pool.free.push_back(p);
      return;
    }
    ::operator delete(p);
  }
  static ContextPool& context_pool() {
    thread_local ContextPool pool;
    return pool;
  }

  int64_t index = -1;
  const OpInfo* info = nullptr;
  std::string where;  // " (file:line)" of an op making uninitialised memory
  c10::SmallVector<at::Tensor, 2> written;
  std::unique_ptr<AlertHandler> alerts;
};

const c10::StorageImpl* storage_of(const at::Tensor& t) {
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (!impl->has_storage() || impl->is_python_dispatch()) {
    return nullptr;
  }
  return impl->storage().unsafeGetStorageImpl();
}

bool readable(const at::Tensor& t) {
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (impl->is_python_dispatch() || t.layout() != at::kStrided || t.is_quantized()) {
    return false;
  }
  const auto keys = impl->key_set();
  return !keys.has(c10::DispatchKey::Functionalize) && !t.is_meta() && impl->has_storage();
}

// A tensor that wraps others (a tensor subclass, vmap's batched tensor, grad's wrapper,
// functionalization, nested tensors): ops on it are looked through to the ops they
// run on the wrapped tensors, as a Python dispatch mode sees them.
bool wrapper(const c10::IValue& v) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) {
      return false;
    }
    const auto keys = t.unsafeGetTensorImpl()->key_set();
    return keys.has(c10::DispatchKey::Python) || keys.has(c10::DispatchKey::FuncTorchBatched) ||
           keys.has(c10::DispatchKey::FuncTorchGradWrapper) ||
           keys.has(c10::DispatchKey::Functionalize) ||
           keys.has(c10::DispatchKey::BatchedNestedTensor) || t.is_nested();
  }
  if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorVector()) {
      if (wrapper(c10::IValue(t))) {
        return true;
      }
    }
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (wrapper(e)) {
        return true;
      }
    }
  }
  return false;
}

// Dynamo, AOTAutograd and Inductor trace under these modes: their ops are the
// compiler's, not the test's (the compiled code's own dispatcher calls are recorded).
bool compiling() {
  using c10::impl::TorchDispatchModeKey;
  using c10::impl::TorchDispatchModeTLS;
  return TorchDispatchModeTLS::get_mode(TorchDispatchModeKey::FAKE).has_value() ||
         TorchDispatchModeTLS::get_mode(TorchDispatchModeKey::PROXY).has_value() ||
         TorchDispatchModeTLS::get_mode(TorchDispatchModeKey::FUNCTIONAL).has_value();
}

// Guards one recorder's state against autograd's worker threads; uncontended in
// practice (the calling thread waits for them), so a spin is cheaper than a mutex.
class SpinLock {
 public:
  void lock() {
    while (flag_.test_and_set(std::memory_order_acquire)) {
    }
  }
  void unlock() { flag_.clear(std::memory_order_release); }

 private:
  std::atomic_flag flag_ = ATOMIC_FLAG_INIT;
};

class Recorder;
std::mutex g_active_mutex;
std::atomic<Recorder*> g_active{nullptr};
thread_local int t_inside = 0;

class Recorder {
 public:
  explicit Recorder(const Recorder* previous) {
    if (previous != nullptr) {
      // The next run of a test records about as many ops: no regrowth while recording.
      ops_.reserve(previous->ops_.size() + 16);
      keys_.reserve(previous->keys_.size() + 16);
      for (const auto& entry : previous->exported_) {
        if (entry.second.weak.expired()) {
          continue;
        }
        const int64_t id = static_cast<int64_t>(keys_.size());
        keys_.push_back(entry.second.key);
        put_known(entry.first, Known{entry.second.weak, entry.second.version, id});
      }
    }
  }

  ~Recorder() { stop(); }

  void start() {
    std::lock_guard<std::mutex> lock(g_active_mutex);
    TORCH_CHECK(g_active == nullptr, "another native op recorder is active on this process");
    TORCH_CHECK(!finished_, "a native op recorder records one run");
    g_active = this;
    handle_ = at::addThreadLocalCallback(at::RecordFunctionCallback(&on_start, &on_end)
                                             .needsInputs(true)
                                             .needsOutputs(true)
                                             .scopes({at::RecordScope::FUNCTION}));
  }

  void stop() {
    std::lock_guard<std::mutex> lock(g_active_mutex);
    if (handle_ != 0) {
      at::removeCallback(handle_);
      handle_ = 0;
    }
    if (g_active == this) {
      g_active = nullptr;
    }
  }

  void set_locator(py::object locator) { locator_ = std::move(locator); }

  void set_observer(py::object observer) { observer_ = std::move(observer); }

  // (fingerprint, census keys, first uses, failure). Two runs with the same
  // fingerprint recorded the same ops with the same keys; rows() gives the record.
  py::tuple finish() {
    stop();
    std::lock_guard<SpinLock> lock(mutex_);
    resolve_pending();
    finished_ = true;
    export_keys();
    std::vector<uint64_t> key_memo(keys_.size(), 0);
    std::vector<uint64_t> input_memo(ops_.size(), 0);
    uint64_t fp = kSeed0;
    ska::flat_hash_map<CensusKey, bool, CensusKeyHash> census;  // -> alerted
    for (size_t i = 0; i < ops_.size(); ++i) {
      const OpRecord& r = ops_[i];
      fp = chain(fp, r.info->name_hash);
      fp = chain(fp, r.has_device ? static_cast<uint64_t>(r.device) + 1 : 0);
      fp = chain(fp, static_cast<uint64_t>(r.dtype));
      fp = chain(fp, inputs_hash(static_cast<int64_t>(i), key_memo, input_memo));
      fp = chain(fp, r.raised ? 1 : 2 + r.outputs.size());
      for (int64_t k : r.outputs) {
        fp = chain(fp, key_hash(k, key_memo, input_memo));
      }
      fp = chain(fp, r.alerted ? 1 : 0);
      fp = chain(fp, r.taint >= 0 ? std::hash<std::string>{}(origins_[static_cast<size_t>(r.taint)])
                                  : 0);
      bool& alerted = census[CensusKey{r.info, r.has_device ? static_cast<int>(r.device) : -1,
                                       r.has_device ? static_cast<int>(r.dtype) : -1}];
      alerted = alerted || r.alerted;
    }
    py::list keys;
    for (const auto& entry : census) {
      const OpInfo* info = entry.first.info;
      const int device = entry.first.device;
      const int dtype = entry.first.dtype;
      py::object dev = py::none();
      py::object dt = py::none();
      if (device >= 0) {
        dev = py::str(c10::DeviceTypeName(static_cast<c10::DeviceType>(device), true));
        if (static_cast<at::ScalarType>(dtype) != at::ScalarType::Undefined) {
          dt = dtype_object(static_cast<at::ScalarType>(dtype));
        }
      }
      keys.append(py::make_tuple(info->name, dev, dt, entry.second));
    }
    py::list uses;
    for (size_t i = 0; i < first_uses_.size(); ++i) {
      if (!first_use_refs_[i].expired()) {  // dead ones (wrapped Python numbers) say nothing
        uses.append(py::make_tuple(first_uses_[i].first,
                                   reinterpret_cast<uintptr_t>(first_uses_[i].second)));
      }
    }
    py::object failure = failure_.empty() ? py::object(py::none()) : py::str(failure_);
    return py::make_tuple(py::int_(fp), keys, uses, failure);
  }

  // The record, op by op, as recorder.py's OpCall fields (after finish()).
  py::list rows() {
    std::lock_guard<SpinLock> lock(mutex_);
    std::vector<py::object> key_objs(keys_.size());
    std::vector<py::object> input_objs(ops_.size());
    py::list rows;
    for (size_t i = 0; i < ops_.size(); ++i) {
      const OpRecord& r = ops_[i];
      py::object device = py::none();
      py::object dtype = py::none();
      if (r.has_device) {
        device = py::str(c10::DeviceTypeName(r.device, /*lower_case=*/true));
        if (r.dtype != at::ScalarType::Undefined) {
          dtype = dtype_object(r.dtype);
        }
      }
      py::object inputs = op_inputs(static_cast<int64_t>(i), key_objs, input_objs);
      py::tuple outputs;
      if (r.raised) {
        outputs = py::make_tuple(py::make_tuple("raised", "exception"));
      } else {
        outputs = py::tuple(r.outputs.size());
        for (size_t j = 0; j < r.outputs.size(); ++j) {
          outputs[j] = key_object(r.outputs[j], key_objs, input_objs);
        }
      }
      py::object tainted = py::none();
      if (r.taint >= 0) {
        tainted = py::str(origins_[static_cast<size_t>(r.taint)]);
      }
      rows.append(py::make_tuple(r.info->name, device, dtype, inputs, outputs, r.alerted,
                                 tainted));
    }
    return rows;
  }

  // Marks the last op that raised as a determinism alert (the run's exception said so).
  void note_alert() {
    std::lock_guard<SpinLock> lock(mutex_);
    for (auto it = ops_.rbegin(); it != ops_.rend(); ++it) {
      if (it->raised) {
        it->alerted = true;
        return;
      }
    }
  }


 private:
  static std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
    if (t_inside > 0) {
      return nullptr;  // inside a recorded op: its own calls are part of it
    }
    Recorder* self = g_active;
    if (self == nullptr) {
      return nullptr;
    }
    const OpInfo& info = info_of(fn);
    if (!info.op || info.composite || compiling()) {
      return nullptr;  // looked through: the ops it calls are recorded
    }
    for (const auto& v : fn.inputs()) {
      if (wrapper(v)) {
        return nullptr;
      }
    }
    ++t_inside;
    auto ctx = std::make_unique<OpContext>();
    try {
      self->begin_op(fn, info, *ctx);
    } catch (const std::exception& e) {
      self->fail(e.what());
      ctx->index = -1;
    }
    return ctx;
  }

  static void on_end(const at::RecordFunction& fn, at::ObserverContext* raw) {
    if (raw == nullptr) {
      return;
    }
    auto* ctx = static_cast<OpContext*>(raw);
    if (ctx->alerts) {
      c10::WarningUtils::set_warning_handler(ctx->alerts->previous_);
    }
    Recorder* self = g_active;
    if (self == nullptr || ctx->index < 0) {
      --t_inside;
      return;
    }
    const bool raised = std::uncaught_exceptions() > 0;
    try {
      if (!raised && ctx->info != nullptr && ctx->info->uninitialized) {
        // Python runs here, before the recorder's lock is taken: a thread holding the
        // GIL may be waiting for that lock.
        ctx->where = self->where();
      }
      self->end_op(fn, *ctx, raised);
    } catch (const std::exception& e) {
      self->fail(e.what());
    }
    if (!raised && self->observer_ && !self->observer_.is_none()) {
      // After the op: its autograd node exists, as a dispatch mode would see it.
      py::gil_scoped_acquire gil;
      try {
        self->observer_(ctx->index, fn.name());
      } catch (py::error_already_set& e) {
        e.discard_as_unraisable("pytest_backends native recorder observer");
      }
    }
    --t_inside;
  }

  void fail(const char* what) {
    std::lock_guard<SpinLock> lock(mutex_);
    if (failure_.empty()) {
      std::string text = what;
      const auto nl = text.find('\n');
      failure_ = "native recorder: " + text.substr(0, nl);
    }
    broken_ = true;
  }

  void begin_op(const at::RecordFunction& fn, const OpInfo& info, OpContext& ctx) {
    std::lock_guard<SpinLock> lock(mutex_);
    if (broken_ || finished_) {
      return;
    }
    // The recorder's own calls (digests) are not recorded because t_inside is raised
    // around begin_op and end_op (a RecordFunctionGuard would rebuild torch's
    // callback cache twice per op).
    const int64_t index = static_cast<int64_t>(ops_.size());
    OpRecord& rec = ops_.emplace_back();  // built in place; nothing else grows ops_ here
    rec.info = &info;
    const auto inputs = fn.inputs();
    for (int w : info.written) {
      if (static_cast<size_t>(w) < inputs.size()) {
        collect_tensors(inputs[static_cast<size_t>(w)], ctx.written);
      }
    }
    note_writes(ctx.written);
    const bool unread = !tainted_.empty() && (info.pure_view || info.overwrites);
    rec.inputs.reserve(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      const bool written = std::find(info.written.begin(), info.written.end(),
                                     static_cast<int>(i)) != info.written.end();
      rec.inputs.push_back(slot_of(inputs[i], index, unread && (info.pure_view || written)));
    }
    if (!tainted_.empty() && !unread) {
      rec.taint = reads_taint(info, inputs);
    }
    for (const auto& v : inputs) {
      if (first_tensor(v, rec)) {
        break;
      }
    }
    if (at::globalContext().deterministicAlgorithms() &&
        at::globalContext().deterministicAlgorithmsWarnOnly()) {
      ctx.alerts = std::make_unique<AlertHandler>(c10::WarningUtils::get_warning_handler());
      c10::WarningUtils::set_warning_handler(ctx.alerts.get());
    }
    ctx.index = index;
    ctx.info = &info;
  }

  void end_op(const at::RecordFunction& fn, OpContext& ctx, bool raised) {
    std::lock_guard<SpinLock> lock(mutex_);
    if (broken_ || finished_ || ctx.index < 0 || static_cast<size_t>(ctx.index) >= ops_.size()) {
      return;
    }
    OpRecord& rec = ops_[static_cast<size_t>(ctx.index)];
    const OpInfo& info = *rec.info;
    if (ctx.alerts && ctx.alerts->alerted) {
      rec.alerted = true;
    }
    if (raised) {
      rec.raised = true;
      return;
    }
    bool device_from_output = false;
    auto record_output = [&](const at::Tensor& t, size_t j) {
      if (!device_from_output) {
        rec.device = t.device().type();
        rec.dtype = t.scalar_type();
        rec.has_device = true;
        device_from_output = true;
      }
      int64_t key;
      if (info.uninitialized) {
        key = uninitialized(t, info, ctx.where);
      } else if (info.pure_view) {
        Key k;
        k.kind = KeyKind::View;
        k.op = ctx.index;
        k.index = static_cast<int32_t>(j);
        key = add_key(std::move(k));
      } else if (std::find(info.workspaces.begin(), info.workspaces.end(),
                           static_cast<int>(j)) != info.workspaces.end()) {
        key = shape_key(t, KeyKind::Workspace);
      } else {
        key = digest(t, false);
      }
      remember(t, key);
      rec.outputs.push_back(key);
    };
    const auto& outputs = fn.outputs();
    if (outputs.size() == 1 && outputs[0].isTensor() && outputs[0].toTensor().defined()) {
      record_output(outputs[0].toTensor(), 0);  // the common case: one tensor, no copy
    } else {
      c10::SmallVector<at::Tensor, 4> tensors;
      for (const auto& v : outputs) {
        collect_tensors(v, tensors);
      }
      if (tensors.empty()) {
        tensors.assign(ctx.written.begin(), ctx.written.end());  // in-place ops returning nothing
      }
      for (size_t j = 0; j < tensors.size(); ++j) {
        record_output(tensors[j], j);
      }
      if (tensors.empty()) {
        for (const auto& v : outputs) {
          if (!v.isNone()) {  // a Python number or other value: its value is the result
            Key k;
            k.kind = KeyKind::Value;
            k.value = v;
            rec.outputs.push_back(add_key(std::move(k)));
          }
        }
      }
    }
    if (info.overwrites && !tainted_.empty()) {
      clear_taint(ctx.written);
    }
  }

  template <typename Out>
  static void collect_tensors(const c10::IValue& v, Out& out) {
    if (v.isTensor()) {
      if (v.toTensor().defined()) {
        out.push_back(v.toTensor());
      }
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorVector()) {
        if (t.defined()) {
          out.push_back(t);
        }
      }
    } else if (v.isList()) {
      for (const c10::IValue& e : v.toListRef()) {
        collect_tensors(e, out);
      }
    } else if (v.isTuple()) {
      for (const c10::IValue& e : v.toTupleRef().elements()) {
        collect_tensors(e, out);
      }
    }
  }

  static bool first_tensor(const c10::IValue& v, OpRecord& rec) {
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.defined()) {
        return false;
      }
      rec.device = t.device().type();
      rec.dtype = t.scalar_type();
      rec.has_device = true;
      return true;
    }
    if (!v.isTensorList() && !v.isList() && !v.isTuple()) {
      return false;
    }
    c10::SmallVector<at::Tensor, 4> ts;
    collect_tensors(v, ts);
    if (ts.empty()) {
      return false;
    }
    rec.device = ts[0].device().type();
    rec.dtype = ts[0].scalar_type();
    rec.has_device = true;
    return true;
  }

  Slot slot_of(const c10::IValue& v, int64_t index, bool unread) {
    Slot s;
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.defined()) {
        s.kind = Slot::NoTensor;
        return s;
      }
      s.kind = Slot::Tensor;
      if (unread && taint_of(t) >= 0) {
        s.key = shape_key(t, KeyKind::Uninitialized);
      } else {
        s.key = input_key(t, index);
      }
      return s;
    }
    if (v.isTensorList() || v.isList() || v.isTuple()) {
      s.kind = Slot::List;
      if (v.isTensorList()) {
        for (const at::Tensor& t : v.toTensorVector()) {
          s.items.push_back(slot_of(c10::IValue(t), index, unread));
        }
      } else if (v.isList()) {
        for (const c10::IValue& e : v.toListRef()) {
          s.items.push_back(slot_of(e, index, unread));
        }
      } else {
        for (const c10::IValue& e : v.toTupleRef().elements()) {
          s.items.push_back(slot_of(e, index, unread));
        }
      }
      return s;
    }
    s.kind = Slot::Value;
    s.value = v;
    return s;
  }

  int64_t input_key(const at::Tensor& t, int64_t index) {
    c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    const bool versioned = !impl->is_inference();
    auto it = known_.find(impl);
    if (versioned && it != known_.end() && !it->second.weak.expired() &&
        it->second.version == static_cast<int64_t>(impl->version_counter().current_version())) {
      return it->second.key;
    }
    // From outside the run, or changed since: digested at this first use.
    first_uses_.emplace_back(index, impl);
    first_use_refs_.emplace_back(t.getIntrusivePtr());
    const int64_t key = digest(t, true);
    remember(t, key);
    return key;
  }

  void remember(const at::Tensor& t, int64_t key) {
    c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    if (impl->is_inference()) {
      return;  // no version counter: digested at every use
    }
    put_known(impl, Known{c10::weak_intrusive_ptr<c10::TensorImpl>::reclaim_copy(impl),
                          static_cast<int64_t>(impl->version_counter().current_version()), key});
    if (known_.size() > prune_at_) {
      for (auto it = known_.begin(); it != known_.end();) {
        it = it->second.weak.expired() ? known_.erase(it) : std::next(it);
      }
      prune_at_ = std::max<size_t>(2 * known_.size(), 4096);
    }
  }

  void put_known(c10::TensorImpl* impl, Known entry) {
    auto it = known_.find(impl);
    if (it != known_.end()) {
      it->second = std::move(entry);
    } else {
      known_.emplace(impl, std::move(entry));
    }
  }

  int64_t add_key(Key k) {
    keys_.push_back(std::move(k));
    return static_cast<int64_t>(keys_.size()) - 1;
  }

  int64_t shape_key(const at::Tensor& t, KeyKind kind, const char* reason = "") {
    Key k;
    k.kind = kind;
    k.dtype = t.scalar_type();
    k.shape.assign(t.sizes().begin(), t.sizes().end());
    k.reason = reason;
    return add_key(std::move(k));
  }

  int64_t digest(const at::Tensor& t, bool external) {
    if (!readable(t)) {
      return shape_key(t, KeyKind::Opaque, t.is_meta() ? "meta" : "unreadable");
    }
    if (t.numel() == 0) {
      return shape_key(t, KeyKind::Empty);
    }
    Key k;
    k.external = external;
    if (external) {
      k.storage = storage_of(t);
    }
    const bool cpu = t.device().is_cpu();
    // Only a digest that calls ops (a layout to resolve, a device kernel) needs them
    // kept from Python modes and autograd; most CPU outputs call none.
    std::optional<c10::impl::ExcludeDispatchKeyGuard> no_python;
    std::optional<at::AutoDispatchBelowADInplaceOrView> no_autograd;
    if (!cpu || !t.is_contiguous() || t.is_conj() || t.is_neg()) {
      no_python.emplace(
          c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
      no_autograd.emplace();
    }
    try {
      if (cpu) {
        uint64_t d[2];
        digest_host(t, d);
        k.kind = KeyKind::Digest;
        k.h0 = d[0];
        k.h1 = d[1];
      } else {
        static const auto op = c10::Dispatcher::singleton()
                                   .findSchemaOrThrow("pytest_backends::digest", "")
                                   .typed<at::Tensor(const at::Tensor&)>();
        k.kind = KeyKind::Pending;
        k.pending = static_cast<int64_t>(pending_.size());
        pending_.push_back(op.call(t));
      }
    } catch (const c10::Error&) {
      return shape_key(t, KeyKind::Opaque, "unreadable");
    }
    return add_key(std::move(k));
  }

  int64_t uninitialized(const at::Tensor& t, const OpInfo& info, const std::string& where) {
    if (t.numel() > 0) {
      const c10::StorageImpl* storage = storage_of(t);
      if (storage != nullptr) {
        std::string origin = info.name + where;
        tainted_.insert_or_assign(
            storage, std::make_pair(t.storage().getWeakStorageImpl(),
                                    static_cast<int64_t>(origins_.size())));
        origins_.push_back(std::move(origin));
      }
    }
    return shape_key(t, KeyKind::Uninitialized);
  }

  // " (test_x.py:12)": where the Python caller is, from the locator (with the GIL).
  std::string where() {
    if (!locator_ || locator_.is_none()) {
      return "";
    }
    py::gil_scoped_acquire gil;
    try {
      return py::cast<std::string>(locator_());
    } catch (const std::exception&) {
      return "";
    }
  }

  int64_t taint_of(const at::Tensor& t) {
    if (tainted_.empty() || t.numel() == 0) {
      return -1;
    }
    const c10::StorageImpl* storage = storage_of(t);
    auto it = tainted_.find(storage);
    if (it == tainted_.end()) {
      return -1;
    }
    if (it->second.first.expired()) {
      tainted_.erase(it);
      return -1;
    }
    return it->second.second;
  }

  int64_t reads_taint(const OpInfo& info, c10::ArrayRef<const c10::IValue> inputs) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      const int pos = static_cast<int>(i);
      if (std::find(info.outs.begin(), info.outs.end(), pos) != info.outs.end()) {
        continue;
      }
      if (info.overwrites &&
          std::find(info.written.begin(), info.written.end(), pos) != info.written.end()) {
        continue;
      }
      std::vector<at::Tensor> ts;
      collect_tensors(inputs[i], ts);
      for (const auto& t : ts) {
        const int64_t origin = taint_of(t);
        if (origin >= 0) {
          return origin;
        }
      }
    }
    return -1;
  }

  template <typename Tensors>
  void clear_taint(const Tensors& written) {
    for (const auto& t : written) {
      const c10::StorageImpl* storage = storage_of(t);
      if (storage != nullptr && t.is_contiguous() &&
          static_cast<size_t>(t.numel() * static_cast<int64_t>(t.element_size())) ==
              storage->nbytes()) {
        tainted_.erase(storage);
      }
    }
  }

  // Storages written through tensors from outside the run: such a write may bypass
  // another tensor's version counter (p.data.add_()), so no key on them is carried over.
  template <typename Tensors>
  void note_writes(const Tensors& written) {
    for (const auto& t : written) {
      c10::TensorImpl* impl = t.unsafeGetTensorImpl();
      auto it = known_.find(impl);
      if (it == known_.end() || it->second.weak.expired() ||
          keys_[static_cast<size_t>(it->second.key)].external ||
          keys_[static_cast<size_t>(it->second.key)].kind == KeyKind::View) {
        written_external_.insert(storage_of(t));
      }
    }
  }

  void resolve_pending() {
    if (pending_.empty()) {
      return;
    }
    at::RecordFunctionGuard no_callbacks(false);
    c10::impl::ExcludeDispatchKeyGuard no_python(
        c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
    at::AutoDispatchBelowADInplaceOrView no_autograd;
    std::vector<std::pair<uint64_t, uint64_t>> values(pending_.size());
    std::unordered_map<std::string, std::vector<size_t>> by_device;
    for (size_t i = 0; i < pending_.size(); ++i) {
      by_device[pending_[i].device().str()].push_back(i);
    }
    for (const auto& group : by_device) {
      std::vector<at::Tensor> parts;
      for (size_t i : group.second) {
        parts.push_back(pending_[i]);
      }
      const at::Tensor host = at::stack(parts).cpu().contiguous();
      const auto* p = host.data_ptr<int64_t>();
      for (size_t n = 0; n < group.second.size(); ++n) {
        values[group.second[n]] = {static_cast<uint64_t>(p[2 * n]),
                                   static_cast<uint64_t>(p[2 * n + 1])};
      }
    }
    for (auto& k : keys_) {
      if (k.kind == KeyKind::Pending) {
        k.kind = KeyKind::Digest;
        k.h0 = values[static_cast<size_t>(k.pending)].first;
        k.h1 = values[static_cast<size_t>(k.pending)].second;
        k.pending = -1;
      }
    }
    pending_.clear();
  }

  void export_keys() {
    for (const auto& entry : known_) {
      const Key& k = keys_[static_cast<size_t>(entry.second.key)];
      if (k.kind == KeyKind::Digest && k.external && !entry.second.weak.expired() &&
          written_external_.count(k.storage) == 0) {
        exported_.insert_or_assign(entry.first,
                                   Exported{entry.second.weak, entry.second.version, k});
      }
    }
    known_.clear();
  }

  // --- fingerprints: equal exactly when the Python rows would compare equal ------

  static uint64_t chain(uint64_t h, uint64_t v) { return mix0(h ^ (v * kKey0 + kSeed1)); }

  uint64_t key_hash(int64_t id, std::vector<uint64_t>& memo, std::vector<uint64_t>& input_memo) {
    uint64_t& slot = memo[static_cast<size_t>(id)];
    if (slot != 0) {
      return slot;
    }
    const Key& k = keys_[static_cast<size_t>(id)];
    uint64_t h = chain(kSeed1, static_cast<uint64_t>(k.kind) + 1);
    if (k.kind == KeyKind::Digest) {
      h = chain(chain(h, k.h0), k.h1);
    } else if (k.kind == KeyKind::Value) {
      h = chain(h, value_hash(k.value));
    } else if (k.kind == KeyKind::View) {
      h = chain(h, ops_[static_cast<size_t>(k.op)].info->name_hash);
      h = chain(h, static_cast<uint64_t>(k.index));
      h = chain(h, inputs_hash(k.op, memo, input_memo));
    } else {
      h = chain(h, static_cast<uint64_t>(k.dtype));
      h = chain(h, k.shape.size());
      for (int64_t d : k.shape) {
        h = chain(h, static_cast<uint64_t>(d));
      }
      h = chain(h, std::hash<std::string>{}(k.reason));
    }
    slot = h | 1;  // never 0, the "not computed" mark
    return slot;
  }

  uint64_t inputs_hash(int64_t op, std::vector<uint64_t>& memo, std::vector<uint64_t>& input_memo) {
    uint64_t& slot = input_memo[static_cast<size_t>(op)];
    if (slot != 0) {
      return slot;
    }
    uint64_t h = kSeed0;
    for (const Slot& s : ops_[static_cast<size_t>(op)].inputs) {
      h = chain(h, slot_hash(s, memo, input_memo));
    }
    slot = h | 1;
    return slot;
  }

  uint64_t slot_hash(const Slot& s, std::vector<uint64_t>& memo, std::vector<uint64_t>& input_memo) {
    switch (s.kind) {
      case Slot::Tensor:
        return chain(1, key_hash(s.key, memo, input_memo));
      case Slot::NoTensor:
        return 2;
      case Slot::List: {
        uint64_t h = chain(3, s.items.size());
        for (const Slot& item : s.items) {
          h = chain(h, slot_hash(item, memo, input_memo));
        }
        return h;
      }
      default:
        return chain(4, value_hash(s.value));
    }
  }

  static uint64_t bits(double d) {
    uint64_t b;
    std::memcpy(&b, &d, sizeof b);
    return b;
  }

  static uint64_t value_hash(const c10::IValue& v) {
    if (v.isNone()) {
      return 11;
    }
    if (v.isBool()) {
      return chain(12, v.toBool() ? 1 : 0);
    }
    if (v.isInt()) {
      return chain(13, static_cast<uint64_t>(v.toInt()));
    }
    if (v.isDouble()) {
      return chain(14, bits(v.toDouble()));
    }
    if (v.isString()) {
      return chain(15, std::hash<std::string>{}(v.toStringRef()));
    }
    if (v.isDevice()) {
      return chain(16, std::hash<std::string>{}(v.toDevice().str()));
    }
    if (v.isComplexDouble()) {
      const auto c = v.toComplexDouble();
      return chain(chain(17, bits(c.real())), bits(c.imag()));
    }
    if (v.isSymInt() && !v.toSymInt().is_heap_allocated()) {
      return chain(13, static_cast<uint64_t>(v.toSymInt().as_int_unchecked()));
    }
    return chain(18, std::hash<std::string>{}(v.tagKind()));
  }

  // --- to Python ---------------------------------------------------------------

  static py::object dtype_object(at::ScalarType t) {
    return py::reinterpret_borrow<py::object>(
        reinterpret_cast<PyObject*>(torch::getTHPDtype(t)));
  }

  template <typename Shape>
  static py::tuple shape_tuple(const Shape& shape) {
    py::tuple out(shape.size());
    for (size_t i = 0; i < shape.size(); ++i) {
      out[i] = py::int_(shape[i]);
    }
    return out;
  }

  py::object key_object(int64_t id, std::vector<py::object>& memo,
                        std::vector<py::object>& input_memo) {
    py::object& slot = memo[static_cast<size_t>(id)];
    if (slot) {
      return slot;
    }
    const Key& k = keys_[static_cast<size_t>(id)];
    switch (k.kind) {
      case KeyKind::Digest:
        slot = py::make_tuple("digest", py::int_(k.h0), py::int_(k.h1));
        break;
      case KeyKind::View:
        slot = py::make_tuple("view", ops_[static_cast<size_t>(k.op)].info->name, k.index,
                              op_inputs(k.op, memo, input_memo));
        break;
      case KeyKind::Uninitialized:
        slot = py::make_tuple("uninitialized", dtype_object(k.dtype), shape_tuple(k.shape));
        break;
      case KeyKind::Workspace:
        slot = py::make_tuple("workspace", dtype_object(k.dtype), shape_tuple(k.shape));
        break;
      case KeyKind::Empty:
        slot = py::make_tuple("empty", dtype_object(k.dtype), shape_tuple(k.shape));
        break;
      case KeyKind::Value:
        slot = value_object(k.value);
        break;
      default:
        slot = py::make_tuple("opaque", dtype_object(k.dtype), shape_tuple(k.shape), k.reason);
        break;
    }
    return slot;
  }

  py::object op_inputs(int64_t op, std::vector<py::object>& memo,
                       std::vector<py::object>& input_memo) {
    py::object& slot = input_memo[static_cast<size_t>(op)];
    if (slot) {
      return slot;
    }
    const auto& inputs = ops_[static_cast<size_t>(op)].inputs;
    py::tuple out(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      out[i] = slot_object(inputs[i], memo, input_memo);
    }
    slot = out;
    return slot;
  }

  py::object slot_object(const Slot& s, std::vector<py::object>& memo,
                         std::vector<py::object>& input_memo) {
    switch (s.kind) {
      case Slot::Tensor:
        return key_object(s.key, memo, input_memo);
      case Slot::NoTensor:
        return py::none();
      case Slot::List: {
        py::tuple out(s.items.size());
        for (size_t i = 0; i < s.items.size(); ++i) {
          out[i] = slot_object(s.items[i], memo, input_memo);
        }
        return out;
      }
      default:
        return value_object(s.value);
    }
  }

  // Plain values as recorder.py keys them: floats by their exact hex form.
  static py::object value_object(const c10::IValue& v) {
    if (v.isNone()) {
      return py::none();
    }
    if (v.isBool()) {
      return py::bool_(v.toBool());
    }
    if (v.isInt()) {
      return py::int_(v.toInt());
    }
    if (v.isDouble()) {
      return py::float_(v.toDouble()).attr("hex")();
    }
    if (v.isString()) {
      return py::str(v.toStringRef());
    }
    if (v.isDevice()) {
      return py::str(v.toDevice().str());
    }
    if (v.isComplexDouble()) {
      const auto c = v.toComplexDouble();
      return py::make_tuple("complex", py::float_(c.real()).attr("hex")(),
                            py::float_(c.imag()).attr("hex")());
    }
    if (v.isSymInt()) {
      const auto s = v.toSymInt();
      if (s.is_heap_allocated()) {
        return py::make_tuple("object", "SymInt");
      }
      return py::int_(s.as_int_unchecked());
    }
    return py::make_tuple("object", v.tagKind());
  }

  SpinLock mutex_;
  at::CallbackHandle handle_ = 0;
  bool finished_ = false;
  bool broken_ = false;
  std::string failure_;
  py::object locator_;
  py::object observer_;
  std::vector<OpRecord> ops_;
  std::vector<Key> keys_;
  std::vector<at::Tensor> pending_;
  // Open addressing: no allocation per remembered tensor.
  ska::flat_hash_map<c10::TensorImpl*, Known> known_;
  std::unordered_map<c10::TensorImpl*, Exported> exported_;
  std::unordered_set<const c10::StorageImpl*> written_external_;
  std::unordered_map<const c10::StorageImpl*,
                     std::pair<c10::weak_intrusive_ptr<c10::StorageImpl>, int64_t>>
      tainted_;
  std::vector<std::string> origins_;
  std::vector<std::pair<int64_t, c10::TensorImpl*>> first_uses_;
  // Keep first-use tensors' addresses from being reused while the record lives.
  std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> first_use_refs_;
  size_t prune_at_ = 4096;
};

}  // namespace

void register_recorder(py::module_& m) {
  py::class_<Recorder>(m, "RunRecorder",
                       "Records the ops of one run at the dispatcher (see recorder.cpp).")
      .def(py::init([](const Recorder* previous) { return new Recorder(previous); }),
           py::arg("previous") = nullptr)
      .def("start", &Recorder::start, "Start recording on this thread.")
      .def("stop", &Recorder::stop, "Stop recording.")
      .def("set_locator", &Recorder::set_locator,
           "A callable giving ' (file:line)' of the Python caller, for uninitialised memory.")
      .def("set_observer", &Recorder::set_observer,
           "A callable called as observer(index, name) after each recorded op (with the GIL).")
      .def("finish", &Recorder::finish,
           "Stop; return (fingerprint, census keys, first uses, failure).")
      .def("rows", &Recorder::rows, "The record as rows of OpCall fields (after finish).")
      .def("note_alert", &Recorder::note_alert,
           "Mark the last op that raised as a determinism alert.");
}

}  // namespace pytest_backends
