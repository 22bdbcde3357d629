// KvLayout geometry for GQA and MLA, bytes per token, element access, and tile addressing through
// a real cache.
#include "lib/kv/kv_layout.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "lib/kv/kv_cache.h"

namespace kiln {
namespace {

TEST(KvLayoutTest, GqaBytesPerTokenIsTwoLayersHeadsDimBytes) {
  // SmolLM2-135M: 30 layers, 3 KV heads, head_dim 64.
  for (auto [type, bytes] :
       {std::pair{GgmlType::kF32, 4}, {GgmlType::kF16, 2}, {GgmlType::kBF16, 2}}) {
    auto layout = KvLayout::Gqa(30, 3, 64, type);
    ASSERT_TRUE(layout.ok()) << layout.status();
    EXPECT_EQ(layout->kind(), KvAttentionKind::kGqa);
    EXPECT_EQ(layout->bytes_per_token(), size_t{2} * 30 * 3 * 64 * bytes);
    EXPECT_EQ(layout->block_size(), 16);
    EXPECT_EQ(layout->tile_bytes(), size_t{16} * 64 * bytes);
    EXPECT_EQ(layout->block_data_bytes(), layout->bytes_per_token() * 16);
    EXPECT_EQ(layout->block_bytes() % KvLayout::kBlockAlignment, 0u);
    EXPECT_GE(layout->block_bytes(), layout->block_data_bytes());
  }
}

TEST(KvLayoutTest, MlaBytesPerTokenIsLayersTimesLatentPlusRope) {
  // DeepSeek-V2-Lite: 27 layers, d_c = 512, d_r = 64.
  auto layout = KvLayout::Mla(27, 512, 64, GgmlType::kBF16);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->kind(), KvAttentionKind::kMla);
  EXPECT_EQ(layout->bytes_per_token(), size_t{27} * (512 + 64) * 2);
  EXPECT_EQ(layout->row_elems(), 576);
  EXPECT_EQ(layout->kv_lora_rank(), 512);
  EXPECT_EQ(layout->rope_dim(), 64);
  EXPECT_EQ(layout->tiles_per_layer(), 1);
  EXPECT_EQ(layout->LatentTileIndex(3), 3u);
  EXPECT_EQ(layout->tiles_per_block(), 27);
}

TEST(KvLayoutTest, GqaTilesFollowLayerKvHeadOrder) {
  // [layer][K|V][kv_head] tiles of [block_size][head_dim], block_size 8, head_dim 4, f16: a tile
  // is 64 bytes.
  auto layout = KvLayout::Gqa(2, 3, 4, GgmlType::kF16, 8);
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->tile_bytes(), 64u);
  EXPECT_EQ(layout->tiles_per_block(), 12);
  EXPECT_EQ(layout->KeyTileIndex(0, 0), 0u);
  EXPECT_EQ(layout->KeyTileIndex(0, 2), 2u);
  EXPECT_EQ(layout->ValueTileIndex(0, 0), 3u);
  EXPECT_EQ(layout->ValueTileIndex(0, 2), 5u);
  EXPECT_EQ(layout->KeyTileIndex(1, 0), 6u);
  EXPECT_EQ(layout->ValueTileIndex(1, 2), 11u);
  EXPECT_EQ(layout->block_data_bytes(), 768u);
  EXPECT_EQ(layout->block_bytes(), 768u);
  // A 100-byte block is padded to 128.
  auto odd = KvLayout::Gqa(1, 1, 5, GgmlType::kF16, 5);  // 2 tiles of 50 bytes
  ASSERT_TRUE(odd.ok());
  EXPECT_EQ(odd->block_data_bytes(), 100u);
  EXPECT_EQ(odd->block_bytes(), 128u);
}

TEST(KvLayoutTest, RejectsBadShapesAndUnsupportedTypes) {
  EXPECT_EQ(KvLayout::Gqa(0, 1, 64, GgmlType::kF16).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvLayout::Gqa(1, 0, 64, GgmlType::kF16).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvLayout::Gqa(1, 1, 0, GgmlType::kF16).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvLayout::Gqa(1, 1, 64, GgmlType::kF16, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvLayout::Mla(1, 0, 64, GgmlType::kF16).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvLayout::Mla(1, 512, 0, GgmlType::kF16).status().code(),
            absl::StatusCode::kInvalidArgument);
  const auto q4 = KvLayout::Gqa(1, 1, 64, GgmlType::kQ4_0);
  EXPECT_EQ(q4.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(q4.status().message().find("q4_0"), std::string_view::npos) << q4.status();
  // q8_0 rows are whole 32-element blocks (an MLA cache's latent part).
  const auto q8_odd = KvLayout::Gqa(1, 1, 48, GgmlType::kQ8_0);
  EXPECT_EQ(q8_odd.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(q8_odd.status().message().find("multiple of 32"), std::string_view::npos)
      << q8_odd.status();
  const auto q8_mla = KvLayout::Mla(1, 500, 64, GgmlType::kQ8_0);
  EXPECT_EQ(q8_mla.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(q8_mla.status().message().find("kv_lora_rank a multiple of 32, got 500"),
            std::string_view::npos)
      << q8_mla.status();
}

TEST(KvLayoutTest, Q8_0LatentRowsKeepTheRopePartInF16) {
  // DeepSeek-V2-Lite's latent: 512 + 64 per token per layer.
  auto q8 = KvLayout::Mla(27, 512, 64, GgmlType::kQ8_0, 16);
  ASSERT_TRUE(q8.ok()) << q8.status();
  EXPECT_EQ(q8->row_bytes(), 16u * 34 + 64 * 2);  // 16 blocks of 34 bytes, then 64 f16
  EXPECT_EQ(q8->rope_elem_type(), GgmlType::kF16);
  EXPECT_EQ(q8->rope_offset_bytes(), 16u * 34);
  EXPECT_EQ(q8->bytes_per_token(), (16u * 34 + 64 * 2) * 27);
  auto f32 = KvLayout::Mla(27, 512, 64, GgmlType::kF32, 16);
  ASSERT_TRUE(f32.ok());
  EXPECT_EQ(f32->rope_elem_type(), GgmlType::kF32);
  EXPECT_EQ(f32->rope_offset_bytes(), 512u * 4);
}

TEST(KvLayoutTest, Q8_0RowsAreBlocksOf34Bytes) {
  // SmolLM2-135M's cache shape: 30 layers, 3 KV heads of 64.
  auto q8 = KvLayout::Gqa(30, 3, 64, GgmlType::kQ8_0, 16);
  ASSERT_TRUE(q8.ok()) << q8.status();
  EXPECT_EQ(q8->row_bytes(), 68u);  // 2 blocks of (f16 scale + 32 int8)
  EXPECT_EQ(q8->tile_bytes(), 68u * 16);
  EXPECT_EQ(q8->bytes_per_token(), 68u * 30 * 2 * 3);  // 12240
  auto f16 = KvLayout::Gqa(30, 3, 64, GgmlType::kF16, 16);
  ASSERT_TRUE(f16.ok());
  EXPECT_EQ(f16->bytes_per_token(), 128u * 30 * 2 * 3);  // 23040
  EXPECT_EQ(q8->block_bytes() % KvLayout::kBlockAlignment, 0u);
}

TEST(KvLayoutTest, ElementStoreLoadRoundTrips) {
  std::byte buf[16] = {};
  StoreKvElement(GgmlType::kF32, buf, 1, 3.14159f);
  EXPECT_EQ(LoadKvElement(GgmlType::kF32, buf, 1), 3.14159f);
  StoreKvElement(GgmlType::kF16, buf, 3, 1.5f);
  EXPECT_EQ(LoadKvElement(GgmlType::kF16, buf, 3), 1.5f);
  StoreKvElement(GgmlType::kF16, buf, 2, 1.0f / 3.0f);
  EXPECT_NEAR(LoadKvElement(GgmlType::kF16, buf, 2), 1.0f / 3.0f, 1e-3f);
  StoreKvElement(GgmlType::kBF16, buf, 0, -2.5f);
  EXPECT_EQ(LoadKvElement(GgmlType::kBF16, buf, 0), -2.5f);
  EXPECT_EQ(LoadKvElement(GgmlType::kF16, buf, 3), 1.5f);  // neighbours untouched
}

TEST(KvLayoutTest, PlacementsPutTilesWhereTheySay) {
  auto layout = KvLayout::Gqa(2, 3, 4, GgmlType::kF16, 8);  // 12 tiles of 64 bytes, 768 / block
  ASSERT_TRUE(layout.ok());
  std::vector<std::byte> pool(10 * layout->block_bytes());
  std::byte* base = pool.data();
  const KvPlacement block_major = KvPlacement::BlockMajor(base, *layout);
  EXPECT_EQ(block_major.Tile(2, 5) - base, 2 * 768 + 5 * 64);
  const KvPlacement tile_major = KvPlacement::TileMajor(base, *layout, 10);
  EXPECT_EQ(tile_major.Tile(2, 5) - base, 5 * 10 * 64 + 2 * 64);
  // One kv head's tiles of blocks 3, 4, 5 are one run.
  EXPECT_EQ(tile_major.Tile(4, 1) - tile_major.Tile(3, 1), 64);
  EXPECT_EQ(tile_major.Tile(5, 1) - tile_major.Tile(3, 1), 128);
}

TEST(KvLayoutTest, CachePointersAddressDisjointTiles) {
  auto layout = KvLayout::Gqa(2, 2, 4, GgmlType::kF32, 4);  // 8 tiles of 64 bytes
  ASSERT_TRUE(layout.ok());
  constexpr int32_t kBlocks = 4;
  auto cache = KvCache::Create(*layout, {.num_blocks = kBlocks});
  ASSERT_TRUE(cache.ok()) << cache.status();
  KvCache& c = **cache;
  // The host pool is tile-major: tile t of block b at t * kBlocks * tile_bytes + b * tile_bytes.
  const std::byte* base = c.placement().base;
  EXPECT_EQ(c.KeyPtr(1, 1, 1) - base, static_cast<ptrdiff_t>((5 * kBlocks + 1) * 64));
  EXPECT_EQ(c.KeyPtr(2, 1, 1) - c.KeyPtr(1, 1, 1), 64);
  EXPECT_EQ(c.ValueRow(KvSlot{3, 2}, 0, 1) - base,
            static_cast<ptrdiff_t>((3 * kBlocks + 3) * 64 + 2 * 4 * 4));
  // Every (block, layer, K|V, head, slot, dim) element has its own address inside the pool's
  // n_blocks * block_bytes.
  std::vector<int> seen(kBlocks * layout->block_bytes() / 4, 0);
  for (BlockId b = 0; b < kBlocks; ++b) {
    for (int l = 0; l < 2; ++l) {
      for (int h = 0; h < 2; ++h) {
        for (int s = 0; s < 4; ++s) {
          for (int kv = 0; kv < 2; ++kv) {
            const std::byte* row =
                kv == 0 ? c.KeyRow(KvSlot{b, s}, l, h) : c.ValueRow(KvSlot{b, s}, l, h);
            for (int d = 0; d < 4; ++d) ++seen[(row - base) / 4 + d];
          }
        }
      }
    }
  }
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], 1) << "element " << i;

  auto mla = KvLayout::Mla(3, 6, 2, GgmlType::kBF16, 4);  // tiles of 4 rows x 8 x 2 bytes
  ASSERT_TRUE(mla.ok());
  auto mcache = KvCache::Create(*mla, {.num_blocks = 3});
  ASSERT_TRUE(mcache.ok());
  EXPECT_EQ((*mcache)->LatentRow(KvSlot{2, 3}, 2) - (*mcache)->placement().base,
            static_cast<ptrdiff_t>((2 * 3 + 2) * 4 * 8 * 2 + 3 * 8 * 2));
}

// Copy-on-write copies every tile of the block, wherever the placement puts them.
TEST(KvLayoutTest, CopyBlockCopiesEveryTile) {
  auto layout = KvLayout::Gqa(3, 2, 8, GgmlType::kF16, 4);
  ASSERT_TRUE(layout.ok());
  auto cache = KvCache::Create(*layout, {.num_blocks = 5});
  ASSERT_TRUE(cache.ok()) << cache.status();
  KvCache& c = **cache;
  const KvPlacement& p = c.placement();
  for (BlockId b = 0; b < 5; ++b) {
    for (int32_t t = 0; t < layout->tiles_per_block(); ++t) {
      std::memset(p.Tile(b, t), 0x10 * b + t, layout->tile_bytes());
    }
  }
  c.storage().CopyBlock(1, 3);
  for (BlockId b = 0; b < 5; ++b) {
    for (int32_t t = 0; t < layout->tiles_per_block(); ++t) {
      const int expected = 0x10 * (b == 3 ? 1 : b) + t;
      for (size_t i = 0; i < layout->tile_bytes(); ++i) {
        ASSERT_EQ(static_cast<int>(p.Tile(b, t)[i]), expected) << b << " " << t << " " << i;
      }
    }
  }
}

TEST(KvLayoutTest, CacheSizedInBytesRoundsDownToBlocks) {
  auto layout = KvLayout::Gqa(1, 1, 16, GgmlType::kF32, 16);  // 2 KiB blocks
  ASSERT_TRUE(layout.ok());
  auto cache = KvCache::Create(*layout, {.capacity_bytes = 10 * 2048 + 100});
  ASSERT_TRUE(cache.ok()) << cache.status();
  EXPECT_EQ((*cache)->Counters().blocks_total, 9);  // 10 blocks, one of them the null block
  EXPECT_EQ(KvCache::Create(*layout, {.capacity_bytes = 2048}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvCache::Create(*layout, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvCache::Create(*layout, {.num_blocks = 4, .capacity_bytes = 4096}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kiln
