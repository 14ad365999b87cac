// ember — the data pipeline: datasets (IDX, Fashion-MNIST, packed record files), tar archives, samplers, transforms
// and the DataLoader. Separate from ember/ember.hpp because reading gzip-compressed IDX files uses zlib: link the CMake
// target ember::ember (it carries ZLIB::ZLIB when CMake finds zlib) or add -lz.
#pragma once

#include "ember/data/dataset.hpp"
#include "ember/data/rng.hpp"
#include "ember/data/sampler.hpp"
#include "ember/data/transforms.hpp"
#include "ember/data/dataloader.hpp"
#include "ember/data/idx.hpp"
#include "ember/data/fashion_mnist.hpp"
#include "ember/data/record_file.hpp"
#include "ember/data/record_dataset.hpp"
#include "ember/data/tar.hpp"

// Images (JPEG/PNG decoding, ImagePipeline, ImageFolder, packed image shards, WebDataset tar shards): opt-in, since decoding links libjpeg
// and libspng. The CMake target ember::image defines EMBER_WITH_IMAGE; without CMake, define it and link -ljpeg -lspng.
#if defined(EMBER_WITH_IMAGE) && EMBER_WITH_IMAGE
#include "ember/data/image.hpp"
#include "ember/data/image_encode.hpp"
#include "ember/data/image_folder.hpp"
#include "ember/data/image_pipeline.hpp"
#include "ember/data/image_records.hpp"
#include "ember/data/image_resample.hpp"
#include "ember/data/image_tar.hpp"
#include "ember/data/image_transforms.hpp"
#include "ember/data/image_types.hpp"
#endif

// Opt-in precompilation (see the end of <ember/ember.hpp>): the DataLoader over the built-in image dataset with the
// transforms the examples use, compiled once into ember::precompiled.
#ifdef EMBER_PRECOMPILED_EXTERN  // (config.hpp)
namespace ember::data {
EMBER_PRECOMPILED_EXTERN template class DataLoader<FashionMNIST>;
EMBER_PRECOMPILED_EXTERN template class DataLoader<FashionMNIST, transforms::Normalize>;
EMBER_PRECOMPILED_EXTERN template class DataLoader<
    FashionMNIST, transforms::Compose<transforms::RandomHorizontalFlip, transforms::Normalize>>;
}  // namespace ember::data
#endif
