// ember — images for the data pipeline: JPEG and PNG decoding (with reduced-size and crop-first decoding), the
// torchvision transforms on images, the fused ImagePipeline that writes decoded images straight into batches,
// ImageFolder, and packed image shards (ImageRecordDataset). Separate from <ember/data.hpp> because decoding links
// libjpeg and libspng: link the CMake target ember::image (Debian: libjpeg62-turbo-dev, libspng-dev).
#pragma once

#include "ember/data/image.hpp"
#include "ember/data/image_encode.hpp"
#include "ember/data/image_folder.hpp"
#include "ember/data/image_pipeline.hpp"
#include "ember/data/image_records.hpp"
#include "ember/data/image_resample.hpp"
#include "ember/data/image_transforms.hpp"
#include "ember/data/image_types.hpp"
